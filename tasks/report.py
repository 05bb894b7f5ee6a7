"""What a finished run shows in the Prefect UI: statistics, failures, where the output is."""
from __future__ import annotations

from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect import task
from prefect.cache_policies import NONE


@task(name="publish-report", cache_policy=NONE)
def publish(run_path: Path, stats: dict) -> None:
    key = "".join(c if c.isalnum() else "-" for c in str(stats["run_name"]).lower())
    rows = [{"tool": t, **v} for t, v in stats["tool_statistics"].items()]
    if rows:
        create_table_artifact(rows, key=f"tools-{key}", description="Tool calls in the run's trajectories")
    if stats["failure_reasons"]:
        create_table_artifact([{"reason": r, "prompts": n} for r, n in stats["failure_reasons"].items()],
                              key=f"failures-{key}", description="Failed prompts by reason (retried on --resume)")
    summary = "\n".join(f"| {k} | {v} |" for k, v in stats.items() if not isinstance(v, dict))
    create_markdown_artifact(
        f"# Run `{stats['run_name']}`\n\n"
        f"- trajectories: `{(run_path / 'trajectories.jsonl').resolve()}`\n"
        f"- statistics: `{(run_path / 'statistics.json').resolve()}`\n\n"
        f"| statistic | value |\n|---|---|\n{summary}\n",
        key=f"summary-{key}", description=f"Summary of run {stats['run_name']}")
