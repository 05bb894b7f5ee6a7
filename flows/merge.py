"""The merge flow: batch files -> trajectories.jsonl + statistics.json, runnable on its own."""
from __future__ import annotations

from pathlib import Path

from prefect import flow

from tasks.report import publish
from tasks.run import merge_run


def merge_and_publish(run_path: Path, max_failed_share: float | None = None) -> dict:
    """Merge the journal and publish the report artifacts into the calling flow run."""
    stats = merge_run(run_path)
    publish(run_path, stats, max_failed_share)
    return stats


@flow(name="merge-run", flow_run_name="merge-{run_name}")
def merge(run_name: str, output_dir: str = "data") -> dict:
    """Rebuild trajectories.jsonl and statistics.json of a run from its batch files (any time, idempotent)."""
    run_path = Path(output_dir) / run_name
    if not run_path.is_dir():
        raise FileNotFoundError(f"no run folder {run_path.resolve()}: nothing to merge")
    return merge_and_publish(run_path)
