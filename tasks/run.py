"""Tasks of a batch run. Each wraps one hermes/ function; none holds logic of its own."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from hermes import merge, remote, runner
from hermes.session import Batch, RunSession


def api_key_from_secret(secret_name: str | None) -> str | None:
    """The model API key from a Prefect Secret block, when named; else hermes reads the environment."""
    if not secret_name:
        return None
    from prefect.blocks.system import Secret

    return str(Secret.load(secret_name).get())


@task(name="plan-run", cache_policy=NONE)
def plan(session: RunSession) -> list[Batch]:
    return session.plan()


@task(name="run-batch", cache_policy=NONE, task_run_name="batch-{batch.num}")
def run_batch(batch: Batch, ctx: runner.RunContext) -> dict[str, int]:
    return runner.run_batch(batch.num, batch.rows, ctx)


@task(name="run-batch", cache_policy=NONE, task_run_name="batch-{batch.num}")
def run_batch_on_worker(batch: Batch, order: remote.RunOrder, api_key_secret: str | None = None) -> dict[str, int]:
    """The same batch on a Dask worker: plain data in; the worker's own client, backend and limiter.
    A worker that dies mid-batch has it rescheduled by Dask; the rerun skips what is journalled.
    The key is never a parameter: the worker reads its own environment, or the named Secret."""
    return remote.run_batch(batch.num, batch.rows, order, api_key=api_key_from_secret(api_key_secret))


@task(name="record-batch", cache_policy=NONE, task_run_name="record-{batch.num}")
def record(session: RunSession, batch: Batch) -> None:
    session.record(batch)


@task(name="merge-run", cache_policy=NONE)
def merge_run(run_path) -> dict:
    return merge.merge(run_path)
