"""Tasks of a batch run. Each wraps one hermes/ function; none holds logic of its own."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from hermes import merge, runner
from hermes.session import Batch, RunSession


@task(name="plan-run", cache_policy=NONE)
def plan(session: RunSession) -> list[Batch]:
    return session.plan()


@task(name="run-batch", cache_policy=NONE, task_run_name="batch-{batch.num}")
def run_batch(batch: Batch, ctx: runner.RunContext) -> dict[str, int]:
    return runner.run_batch(batch.num, batch.rows, ctx)


@task(name="record-batch", cache_policy=NONE, task_run_name="record-{batch.num}")
def record(session: RunSession, batch: Batch) -> None:
    session.record(batch)


@task(name="merge-run", cache_policy=NONE)
def merge_run(run_path) -> dict:
    return merge.merge(run_path)
