"""A run's steps the Prefect way (hermes.run.orchestration.Steps with Prefect hooks).

The UI draws them as the run's graph: plan-run -> one task run per batch (batch-0, batch-1, ...)
-> merge-run -> publish-report; the progress artifact follows the prompts, and the report
artifacts list every batch file. Every batch is a task run on every path (tasks/batch.py): in
this process its prompts are coroutines on the run's loop and the task run waits for them on a
thread of Prefect's thread-pool task runner, handed out as the run's slots can take their prompts
(hermes.run.orchestration.landing); on Dask or worker processes the task runner carries it there.
Each batch task run is tagged `hermes-batch` and `run:<run_name>`, so a Prefect concurrency limit
on either tag bounds the batches running at once. A batch that lands is recorded by the flow
itself (Steps.record, a plain call). Once Prefect's API is gone (tasks.link), the steps still to
come are plain calls.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from prefect import tags
from prefect.client.schemas.objects import State
from prefect.context import FlowRunContext
from prefect.futures import as_completed
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from prefect.utilities.annotations import allow_failure, quote
from prefect.utilities.collections import visit_collection

from hermes.run import local_processes, merge
from hermes.run import orchestration, remote
from hermes.run.session import Batch, Plan, RunSession
from hermes.settings import RunSettings
from tasks.batch import PROMPTS_FAILED, run_batch_here, run_owed
from tasks.link import PrefectLink
from tasks.progress import RunProgress
from tasks.report import publish
from tasks.run import merge_run, plan, run_batch_on_worker

#: landed batches the merge's task run is drawn after (the graph's edges); a run of a hundred
#: thousand batches keeps the last ones only, each a state without its data
MERGE_EDGES = 1000


def edge(state: State, token: str) -> State:
    """What a later task run is drawn after: a task run's final state without its data (a token:
    Prefect asks an upstream state for its result)."""
    return State(type=state.type, name=state.name, state_details=state.state_details, data=token)


def forget(state: State, result: Any) -> Any:
    """Let the flow run's context go of a landed batch's result (returned as it is).

    Prefect links every task run's result, and each object one level inside it, to a copy of the
    task run's state (FlowRunContext.run_results, keyed by id) so that passing it to another task
    draws an edge, and records each task run's assets (task_run_assets); neither is ever dropped
    while the flow runs: ~3 KB a batch task run, 60 MB over 20,000 batches. A batch's outcome goes
    to no other task (the merge is drawn after the landed states themselves)."""
    flow_run = FlowRunContext.get()
    task_run_id = state.state_details.task_run_id
    linked = getattr(flow_run, "run_results", None)  # Prefect's fields: an older one may lack them
    if not isinstance(linked, dict) or task_run_id is None:
        return result

    def drop(obj: Any) -> None:
        entry = linked.get(id(obj))
        linked_state = entry[0] if isinstance(entry, tuple) else entry
        if getattr(getattr(linked_state, "state_details", None), "task_run_id", None) == task_run_id:
            del linked[id(obj)]

    visit_collection(result, drop, max_depth=1)
    assets = getattr(flow_run, "task_run_assets", None)
    if isinstance(assets, dict) and not assets.get(task_run_id, True):  # an empty set: nothing to pass on
        del assets[task_run_id]
    return result


class BatchThreadPool(ThreadPoolTaskRunner):
    """Prefect's thread-pool task runner, forgetting a task run's cancel event once it has ended.

    It keeps a threading.Event per submitted task run (~1.3 KB) until the pool closes, so that
    closing can cancel them: 26 MB over a run of 20,000 batches. An ended task run has nothing
    left to cancel."""

    def submit(self, task, parameters, wait_for=None, dependencies=None):  # noqa: ANN001 (Prefect's own)
        future = super().submit(task, parameters, wait_for=wait_for, dependencies=dependencies)
        events = getattr(self, "_cancel_events", None)
        if isinstance(events, dict):  # the attribute is Prefect's, not a promise: without it, nothing to do
            future.add_done_callback(lambda done: events.pop(done.task_run_id, None))
        return future

    def cancel_all(self) -> None:
        if isinstance(getattr(self, "_cancel_events", None), dict):
            self._cancel_events = dict(self._cancel_events)  # callbacks pop from the old one: none mid-walk
        super().cancel_all()


class PrefectSteps(orchestration.Steps):
    def __init__(self, task_runner: Callable[[RunSettings], TaskRunner], link: PrefectLink,
                 api_key_secret: str | None = None, tool_secrets: dict[str, str] | None = None):
        self.task_runner = task_runner  # the run's settings -> the runner that carries batches elsewhere
        self.link = link
        self.api_key_secret = api_key_secret  # a Dask worker resolves it itself
        self.tool_secrets = tool_secrets  # block names, likewise
        self._progress: RunProgress | None = None
        self._planned = None  # the plan's state: every batch is drawn after it
        self._landed: collections.deque = collections.deque(maxlen=MERGE_EDGES)

    def check(self, settings: RunSettings) -> None:
        pass  # this process's loop, or a Dask cluster (task_runner chooses)

    def plan(self, session: RunSession) -> Plan:
        planned = plan(quote(session), return_state=True)
        # What every batch is drawn after: the plan's state without its data. Prefect walks what
        # wait_for holds, and the plan's data is every batch of the run: walked once per batch,
        # it cost ~270 ms of the flow's CPU a batch at 512 batches (bench/FANOUT_REPORT.md).
        self._planned = edge(planned, "planned")
        return planned.result()

    def _after_plan(self) -> list[Any]:
        return [self._planned] if self._planned is not None else []

    @staticmethod
    def _tags(settings: RunSettings) -> list[str]:
        return ["hermes-batch", f"run:{settings.run_name}"]

    @staticmethod
    def _batch_tags(batch: Batch) -> list[str]:
        """What a batch's task run shows while it runs: its prompts' count (task runs keep no
        parameter values, and the state's message comes only at its end)."""
        return [f"prompts:{batch.size}"]

    def progress(self, run_name: str, total: int) -> Callable[[dict[str, Any]], None]:
        self._progress = RunProgress(run_name, total, self.link)
        return self._progress.prompt_done

    @contextlib.contextmanager
    def fan_out(self, settings: RunSettings) -> Iterator[orchestration.Submit]:
        if not local_processes.elsewhere(settings) and settings.inline_batches:
            with super().fan_out(settings) as plain:  # coroutines in this process, no task run each
                yield plain
            return
        if not local_processes.elsewhere(settings):
            batch_task = run_batch_here.with_options(tags=self._tags(settings), retries=settings.batch_retries)
            # A thread per batch running: landing hands out only as many as the slots can take
            # (the prompts in flight plus a window of queued ones), stragglers included.
            threads = settings.num_workers + -(-settings.num_workers // settings.batch_size) + 2
            with super().fan_out(settings) as plain, BatchThreadPool(max_workers=threads) as pool:
                def here(batch: Batch, ctx) -> Any:
                    if self.link.lost:  # Prefect's API is gone: the batch runs without a task run
                        return plain(batch, ctx)
                    # quoted: Prefect walks no row of the batch, nor the run's context, looking for futures
                    with tags(*self._batch_tags(batch)):
                        return pool.submit(batch_task, {"num": batch.num, "prompts": batch.size,
                                                        "batch": quote(batch), "ctx": quote(ctx)},
                                           wait_for=self._after_plan())
                yield here
            return
        order = remote.order_once()
        worker_task = run_batch_on_worker.with_options(tags=self._tags(settings))
        with self.task_runner(settings) as pool:
            def on_worker(batch: Batch, ctx) -> Any:
                # Plain data crosses to the worker, the same order for every batch of the run
                # (not quoted: the Dask runner's walk over the parameters turns a quote into a tuple).
                with tags(*self._batch_tags(batch)):
                    return pool.submit(worker_task, {"batch": batch, "order": order(ctx),
                                                     "api_key_secret": self.api_key_secret,
                                                     "tool_secrets": self.tool_secrets},
                                       wait_for=self._after_plan())
            yield on_worker

    def as_completed(self, futures: Iterable[Any]) -> Iterator[Any]:
        return as_completed(list(futures))

    def outcome(self, batch: Batch, future: Any, ctx: Any) -> Any:
        """A batch whose prompts failed has landed all the same (its state says so); one that
        raised, raises, unless Prefect's API went away under it: then what it had not finished
        runs here, without a task run (its finished prompts are in the journal)."""
        if isinstance(future, concurrent.futures.Future):  # run without a task run
            return future.result()
        future.wait()  # its final state as the task run returned it (a read from the API could be older)
        state = future.state
        self._landed.append(edge(state, "landed"))  # not the future: its result, events and locks
        if state.name == PROMPTS_FAILED:
            return forget(state, state.data)
        try:
            return forget(state, future.result())
        except Exception:
            if self.link.answers() or local_processes.elsewhere(ctx.settings):
                raise
            return run_owed(batch.num, batch.rows, ctx)

    def merge(self, run_path: Path, max_failed_share: float,
              before_report: Callable[[], Any] = lambda: None) -> dict[str, Any]:
        if self._progress:
            self._progress.close()
        if not self.link.answers():
            return super().merge(run_path, max_failed_share, before_report)
        try:
            merged = merge_run(run_path, wait_for=[allow_failure(f) for f in self._landed], return_state=True)
            stats = merged.result()
        finally:
            before_report()  # the publishing worker's end, overlapped with the merge; the report reads its summary
        self.link.call("publish the report", lambda: publish(run_path, stats, max_failed_share, wait_for=[merged]))
        return stats
