"""The merge flow: batch files -> trajectories.jsonl + statistics.json, runnable on its own."""
from __future__ import annotations

from pathlib import Path

from prefect import flow

from tasks.report import publish
from tasks.run import merge_run


@flow(name="merge-run", flow_run_name="merge-{run_name}")
def merge(run_name: str, output_dir: str = "data") -> dict:
    run_path = Path(output_dir) / run_name
    if not run_path.is_dir():
        raise FileNotFoundError(f"no run folder {run_path}: nothing to merge")
    stats = merge_run(run_path)
    publish(run_path, stats)
    return stats
