"""A whole run in plain Python, without Prefect (`hermes-batch run --engine direct`).

The same orchestration as the Prefect flow (hermes/run/orchestration.py) with its default steps:
no Prefect server to boot or reach, no flow/task-run records, no artifacts; the journal,
index, checkpoint and outputs are identical, so a run started one way resumes the other way.
A Dask address (--dask_address, $HERMES_DASK_ADDRESS) is refused, not ignored: this engine
runs every batch in this process (orchestration.Steps.check says so before anything starts).
"""
from __future__ import annotations

from typing import Any

from hermes.run import orchestration
from hermes.settings import RunSettings


def run(settings: RunSettings, *, api_key: str | None = None) -> dict[str, Any]:
    return orchestration.run(settings, orchestration.Steps(), api_key=api_key)
