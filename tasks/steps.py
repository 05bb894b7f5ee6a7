"""A run's steps the Prefect way (hermes.orchestration.Steps with Prefect hooks).

The UI draws them as the run's graph: plan-run, one batch-N per batch (on the flow's task
runner), a record-N as each lands, then merge-run and publish-report; the progress artifact
follows the prompts. Parameters that are whole objects (the session, the run context) are
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

from hermes import merge, orchestration
from hermes.session import Batch, RunSession
from tasks.link import PrefectLink
from tasks.progress import RunProgress
from tasks.report import publish
from tasks.run import merge_run, plan, record, run_batch


class PrefectSteps(orchestration.Steps):
    def __init__(self, task_runner: Callable[[int], TaskRunner], link: PrefectLink):
        self.task_runner = task_runner  # num_workers -> the runner batch tasks go to
        self.link = link
        self._progress: RunProgress | None = None

    def plan(self, session: RunSession) -> list[Batch]:
        return plan(quote(session))

    def progress(self, run_name: str, total: int) -> Callable[[dict[str, Any]], None]:
        self._progress = RunProgress(run_name, total, self.link)
        return self._progress.prompt_done

    @contextlib.contextmanager
    def fan_out(self, num_workers: int) -> Iterator[orchestration.Submit]:
        with self.task_runner(num_workers) as pool:
            yield lambda batch, ctx: pool.submit(run_batch, {"batch": batch, "ctx": quote(ctx)})

    def as_completed(self, futures: Iterable[Any]) -> Iterator[Any]:
        return as_completed(list(futures))

    def record(self, session: RunSession, batch: Batch) -> None:
        if self.link.lost:
            session.record(batch)
        else:
            record(quote(session), batch)

    def merge(self, run_path: Path, max_failed_share: float) -> dict[str, Any]:
        if self._progress:
            self._progress.close()
        if not self.link.answers():
            return merge.merge(run_path)
        stats = merge_run(run_path)
        self.link.call("publish the report", lambda: publish(run_path, stats, max_failed_share))
        return stats
