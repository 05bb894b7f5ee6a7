"""The lines a prompt logs as it starts and ends: in the batch's logs, on the terminal only when verbose.

Every prompt logs "started" and how it ended on the `hermes.run.prompts` logger. Under Prefect they
land in the batch's task run (a prompt runs in a copy of its batch task's context), so a batch's page
in the UI shows what happened to each of its prompts; a terminal showing every prompt of a long run
would scroll the progress line away, so its handlers get QuietPrompts unless --verbose.
"""
from __future__ import annotations

import logging

log = logging.getLogger("hermes.run.prompts")


class QuietPrompts(logging.Filter):
    """Drops the prompts' start and end lines (below WARNING); their failures still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == log.name and record.levelno < logging.WARNING)


def quiet_prompts_on(handlers: list[logging.Handler]) -> None:
    for handler in handlers:
        if not any(isinstance(f, QuietPrompts) for f in handler.filters):
            handler.addFilter(QuietPrompts())
