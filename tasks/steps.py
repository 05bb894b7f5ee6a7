"""A run's steps the Prefect way (hermes.orchestration.Steps with Prefect hooks).

The UI draws them as the run's graph: plan-run, then merge-run and publish-report; the
progress artifact follows the prompts, and the report artifacts list every batch file.
In this process a batch is not a task run: its prompts are coroutines on the run's loop, as
with `--engine direct` (Steps.fan_out). A task run per batch cost more than the batch it
carried once batches were small: at 512 batches of 4 prompts, about 13 ms of the flow's CPU
and 11 ms of the Prefect server's per batch, on the cores the prompts need (bench/THROUGHPUT.md,
session 8). Batches that go to other processes or machines (--dask_address,
--worker_processes) are task runs: Prefect's Dask task runner is what carries them there.
A batch that lands is recorded by the flow itself (Steps.record, a plain call).
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
from tasks.run import merge_run, plan, run_batch_on_worker


class PrefectSteps(orchestration.Steps):
    def __init__(self, task_runner: Callable[[RunSettings], TaskRunner], link: PrefectLink,
                 api_key_secret: str | None = None, tool_secrets: dict[str, str] | None = None):
        self.task_runner = task_runner  # the run's settings -> the runner that carries batches elsewhere
        self.link = link
        self.api_key_secret = api_key_secret  # a Dask worker resolves it itself
        self.tool_secrets = tool_secrets  # block names, likewise
        self._progress: RunProgress | None = None
        self._task_runs = False  # are the batches of this fan-out Prefect task runs?

    def check(self, settings: RunSettings) -> None:
        pass  # this process's loop, or a Dask cluster (task_runner chooses)

    def plan(self, session: RunSession) -> list[Batch]:
        return plan(quote(session))

    def progress(self, run_name: str, total: int) -> Callable[[dict[str, Any]], None]:
        self._progress = RunProgress(run_name, total, self.link)
        return self._progress.prompt_done

    @contextlib.contextmanager
    def fan_out(self, settings: RunSettings) -> Iterator[orchestration.Submit]:
        if not local_processes.elsewhere(settings):
            self._task_runs = False
            with super().fan_out(settings) as submit:
                yield submit
            return
        self._task_runs = True
        order = remote.order_once()
        with self.task_runner(settings) as pool:
            def on_worker(batch: Batch, ctx) -> Any:
                # Plain data crosses to the worker, the same order for every batch of the run
                # (not quoted: the Dask runner's walk over the parameters turns a quote into a tuple).
                return pool.submit(run_batch_on_worker, {"batch": batch, "order": order(ctx),
                                                         "api_key_secret": self.api_key_secret,
                                                         "tool_secrets": self.tool_secrets})
            yield on_worker

    def as_completed(self, futures: Iterable[Any]) -> Iterator[Any]:
        return as_completed(list(futures)) if self._task_runs else super().as_completed(futures)

    def merge(self, run_path: Path, max_failed_share: float) -> dict[str, Any]:
        if self._progress:
            self._progress.close()
        if not self.link.answers():
            return merge.merge(run_path)
        stats = merge_run(run_path)
        self.link.call("publish the report", lambda: publish(run_path, stats, max_failed_share))
        return stats
