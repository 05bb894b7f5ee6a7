"""A batch as a Prefect task run: its square in the run's graph, its state, its prompts' logs.

The batch's prompts are coroutines on the run's loop (hermes.run.runner.start_batch); the task run
waits for them on a thread of its own, and they run in a copy of its context, so the lines they
log (hermes.run.prompt_log: each prompt's start and end, failures) belong to the batch's task run.

Its state tells the truth: Completed when none of its prompts failed; Failed, named
"PromptsFailed", with a message counting its failed prompts and naming their commonest reason,
otherwise. A Failed batch does not fail the flow run: the run's own verdict (max_failed_share,
after the merge) does that, as before. Prefect's task retries (--batch_retries) run a batch
again only when it raised (failed as a whole, for a transient reason), never for its prompts'
own failures, which the runner already put back in the queue as often as --prompt_retries says.
"""
from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE
from prefect.runtime import task_run
from prefect.states import Completed, Failed, State

from hermes.run import remote, runner
from hermes.run.session import Batch

PROMPTS_FAILED = "PromptsFailed"  # the state's name when the batch ran but some of its prompts failed


def batch_state(num: int, outcome: dict[str, Any]) -> State:
    counts = {k: v for k, v in outcome.items() if isinstance(v, int)}
    total = sum(counts.values())
    failed = counts.get("failed", 0)
    if not failed:
        done = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
        return Completed(message=f"batch {num}: {total} prompt(s), {done or 'none owed'}", data=outcome)
    commonest, group = next(iter((outcome.get("failures") or {"unknown error": {"count": failed}}).items()))
    return Failed(name=PROMPTS_FAILED, data=outcome,
                  message=f"batch {num}: {failed} of {total} prompt(s) failed; commonest: {commonest} "
                          f"({group['count']}){': ' + group['example'] if group.get('example') else ''}")


def raised_for_a_transient_reason(task: Any, run: Any, state: State) -> bool:
    """Retry a batch that raised, never one whose prompts failed (PROMPTS_FAILED) nor one the run stopped."""
    if state.name == PROMPTS_FAILED:
        return False
    error = state.result(raise_on_failure=False)
    if not isinstance(error, Exception):
        return False
    return bool(getattr(error, "transient", isinstance(error, (OSError, TimeoutError, ConnectionError))))


def run_owed(num: int, rows: list, ctx: runner.RunContext) -> dict[str, Any]:
    """Run the rows of batch `num` its journal does not hold yet, here and now (a retry, or a batch
    whose task run Prefect could no longer carry)."""
    todo = remote.owed_rows(ctx.run_dir, num, rows)
    if ctx.admission:
        ctx.admission.handed_out(len(todo))
    return runner.start_batch(num, todo, ctx).result()


@task(name="run-batch", task_run_name="batch-{num}", cache_policy=NONE, retry_delay_seconds=10,
      retry_condition_fn=raised_for_a_transient_reason)
def run_batch_here(num: int, prompts: int, batch: Batch, ctx: runner.RunContext) -> State:
    """One batch in the flow's process; `prompts` is its size, for the UI (task runs keep no values)."""
    if task_run.run_count > 1:  # a retry: what the journal already holds is not run again
        return batch_state(num, run_owed(num, batch.rows, ctx))
    return batch_state(num, runner.start_batch(num, batch.rows, ctx).result())
