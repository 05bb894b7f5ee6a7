"""Prefect's settings for offline, local use: set before Prefect is first imported."""
from __future__ import annotations

import os

# Prefect reads these when first imported: set them before any flow is.
_PREFECT_DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "200",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
    "PREFECT_LOGGING_EXTRA_LOGGERS": "hermes",
    # hermes logs outside flow runs too (tests, chat, the API server): not an error.
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
}


def configure_prefect() -> None:
    for k, v in _PREFECT_DEFAULTS.items():
        os.environ.setdefault(k, v)
