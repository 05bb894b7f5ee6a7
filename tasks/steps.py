"""A run's steps the Prefect way (hermes.orchestration.Steps with Prefect hooks).

The UI draws them as the run's graph: plan-run, one batch-N per batch (on the flow's task
runner), then merge-run and publish-report; the progress artifact follows the prompts. A batch
that lands is recorded by the flow itself (Steps.record, a plain call): recording is an append
and, once a second, an index update, and a task run of its own cost more than that work (a
task run's engine work here and its records in the server, at 512 small batches half the run's
Prefect overhead: bench/THROUGHPUT.md). Parameters that are whole objects (the session, the run context) are
quoted: Prefect passes them as they are instead of walking and copying them.
Once Prefect's API is gone (tasks.link), the steps still to come are plain calls.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from prefect.futures import as_completed
from prefect.task_runners import TaskRunner
from prefect.utilities.annotations import quote

from hermes import local_processes, merge, orchestration, remote
from hermes.session import Batch, RunSession
from hermes.settings import RunSettings
from tasks.link import PrefectLink
from tasks.progress import RunProgress
from tasks.report import publish
from tasks.run import merge_run, plan, run_batch, run_batch_on_worker


class PrefectSteps(orchestration.Steps):
    def __init__(self, task_runner: Callable[[RunSettings], TaskRunner], link: PrefectLink,
                 api_key_secret: str | None = None, tool_secrets: dict[str, str] | None = None):
        self.task_runner = task_runner  # the run's settings -> the runner batch tasks go to
        self.link = link
        self.api_key_secret = api_key_secret  # a Dask worker resolves it itself
        self.tool_secrets = tool_secrets  # block names, likewise
        self._progress: RunProgress | None = None

    def check(self, settings: RunSettings) -> None:
        pass  # threads of the flow's process, or a Dask cluster (task_runner chooses)

    def plan(self, session: RunSession) -> list[Batch]:
        return plan(quote(session))

    def progress(self, run_name: str, total: int) -> Callable[[dict[str, Any]], None]:
        self._progress = RunProgress(run_name, total, self.link)
        return self._progress.prompt_done

    @contextlib.contextmanager
    def fan_out(self, settings: RunSettings) -> Iterator[orchestration.Submit]:
        with self.task_runner(settings) as pool:
            if not local_processes.elsewhere(settings):
                # both quoted: Prefect walks every parameter for upstream futures, a batch's rows included
                yield lambda batch, ctx: pool.submit(run_batch, {"batch": quote(batch), "ctx": quote(ctx)})
                return
            order = remote.order_once()

            def on_worker(batch: Batch, ctx) -> Any:
                # Plain data crosses to the worker, the same order for every batch of the run
                # (not quoted: the Dask runner's walk over the parameters turns a quote into a tuple).
                return pool.submit(run_batch_on_worker, {"batch": batch, "order": order(ctx),
                                                         "api_key_secret": self.api_key_secret,
                                                         "tool_secrets": self.tool_secrets})
            yield on_worker

    def as_completed(self, futures: Iterable[Any]) -> Iterator[Any]:
        return as_completed(list(futures))


    def merge(self, run_path: Path, max_failed_share: float) -> dict[str, Any]:
        if self._progress:
            self._progress.close()
        if not self.link.answers():
            return merge.merge(run_path)
        stats = merge_run(run_path)
        self.link.call("publish the report", lambda: publish(run_path, stats, max_failed_share))
        return stats
