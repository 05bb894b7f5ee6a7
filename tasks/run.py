"""Tasks of a batch run. Each wraps one hermes/ function; none holds logic of its own."""
from __future__ import annotations

import os

from prefect import task
from prefect.cache_policies import NONE
from prefect.states import State

from hermes.run import merge, remote
from hermes.run.session import Batch, Plan, RunSession
from tasks.batch import batch_state


def api_key_from_secret(secret_name: str | None) -> str | None:
    """The model API key from a Prefect Secret block, when named; else hermes reads the environment."""
    if not secret_name:
        return None
    from prefect.blocks.system import Secret

    return str(Secret.load(secret_name).get())


@task(name="plan-run", cache_policy=NONE)
def plan(session: RunSession) -> Plan:
    return session.plan()


def load_tool_secrets(tool_secrets: dict[str, str] | None) -> None:
    """Toolsets' keys (TAVILY_API_KEY, FAL_KEY...) from Prefect Secret blocks, into this process's
    environment, where the toolsets read them; never into parameters, which Prefect stores."""
    if not tool_secrets:
        return
    from prefect.blocks.system import Secret

    for variable, block in tool_secrets.items():
        os.environ[variable] = str(Secret.load(block).get())


@task(name="run-batch", cache_policy=NONE, task_run_name="batch-{batch.num}")
def run_batch_on_worker(batch: Batch, order: remote.RunOrder, api_key_secret: str | None = None,
                        tool_secrets: dict[str, str] | None = None) -> State:
    """The same batch on a Dask worker: plain data in; the worker's own client, backend and limiter.
    A worker that dies mid-batch has it rescheduled by Dask; the rerun skips what is journalled.
    Keys are never parameters: the worker reads its own environment, or loads the named Secret
    blocks itself (the block names cross, not their values)."""
    load_tool_secrets(tool_secrets)
    return batch_state(batch.num, remote.run_batch(batch.num, batch.rows, order, api_key=api_key_from_secret(api_key_secret)))


@task(name="merge-run", cache_policy=NONE)
def merge_run(run_path) -> dict:
    return merge.merge(run_path)
