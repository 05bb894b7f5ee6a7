"""One invocation of a run: refuse or resume, lock the folder, plan what is owed, record batches.

Plain Python; tasks/ and flows/ put Prefect around it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterator

from hermes.data import bitmap
from hermes.data.run_paths import RunPaths
from hermes.run import local_processes, remote, rundir
from hermes.data.dataset import Dataset, Row
from hermes.data.sources import read_source
from hermes.run import task_rows
from hermes.run.attempt_policy import AttemptPolicy
from hermes.run.waves import PolicyPlan
from hermes.run.runner import RunContext
from hermes.sandbox import SandboxRun, WeakerSandbox
from hermes.sandbox.lifecycle import owner_label
from hermes.settings import RunSettings
from hermes.run.workerfiles import forget_dead_workers
from hermes.data.run_index import OWED_CHUNK, RUN_MEMORY, RunIndex

log = logging.getLogger(__name__)
CHECKPOINT_INTERVAL = 5.0  # seconds between checkpoint.json rewrites while batches land
#: seconds between index updates while batches land. Indexing one batch at a time cost about 9 ms
#: of the interpreter's time each, taken from the prompts in flight (512 batches of a 2048-prompt
#: run: 4.6 s). The journal is the truth: a file landed but not yet indexed when the process dies
#: is indexed by the next start, which compares each file's size with the index's.
INDEX_INTERVAL = 1.0


@dataclass
class Batch:
    """A batch of the plan: its rows' places in the dataset, their text read from the file only
    when the batch is handed out (rows), and let go once it has landed (release), so a run holds
    the text of the batches in flight, never the whole dataset's."""

    num: int
    wanted: list[tuple[int, str]]  # (row index, content key), in dataset order
    dataset: Dataset | None = field(default=None, repr=False, compare=False)
    _rows: list[Row] | None = field(default=None, repr=False, compare=False)

    @property
    def size(self) -> int:
        return len(self.wanted)

    @property
    def rows(self) -> list[Row]:
        if self._rows is None:
            self._rows = self.dataset.rows(self.wanted) if self.dataset is not None and self.wanted else []
        return self._rows

    def release(self) -> None:
        self._rows = None

    def __getstate__(self) -> dict:
        # What crosses to another process (a Dask worker) is plain data: the rows, not the dataset.
        return {"num": self.num, "wanted": self.wanted, "dataset": None, "_rows": self.rows}


class Plan:
    """The batches a run owes, made as it is walked: a batch's (index, key) pairs are read off
    the run index a chunk at a time (RunIndex.owed_slice), so that what the plan holds does not
    grow with the dataset (a run of a million prompts holds the batches being handed out, not a
    million pairs). Walk it in the thread that owns the index (the flow's); len() is the number
    of batches, .prompts the prompts owed."""

    def __init__(self, index: RunIndex, dataset: Dataset | None, *, first: int, size: int, prompts: int):
        self.index, self.dataset = index, dataset
        self.first, self.size, self.prompts = first, size, prompts

    def __len__(self) -> int:
        return -(-self.prompts // self.size)

    def __iter__(self) -> Iterator[Batch]:
        num = self.first
        chunk = max(OWED_CHUNK // self.size, 1) * self.size  # whole batches a read
        for start in range(0, self.prompts, chunk):
            pending = self.index.owed_slice(start, start + chunk)
            for j in range(0, len(pending), self.size):
                yield Batch(num, pending[j:j + self.size], self.dataset)
                num += 1


@dataclass
class RunSession:
    settings: RunSettings
    path: Path
    dataset: Dataset
    index: RunIndex
    lock: rundir.RunLock
    ctx: RunContext
    started: datetime = field(default_factory=datetime.now)
    prompts_run: int = 0
    sandboxes: SandboxRun | None = None
    _checkpoint_at: float = 0.0
    _indexed_at: float = 0.0
    _landed: list[tuple[int, list[tuple[int, str]]]] = field(default_factory=list)  # (num, wanted) not yet indexed
    _completed: bytearray | None = None  # a bit a dataset row, set once it is done (checkpoint.json)

    @classmethod
    def open(cls, settings: RunSettings, api_key: str | None = None) -> "RunSession":
        path = rundir.run_dir(settings)
        if rundir.has_results(path) and not settings.resume:
            raise rundir.RunRefused(
                f"run '{settings.run_name}' already has results in {path}. "
                f"Pass --resume (resume: true in a deployment or UI run) to continue it, "
                f"or choose a new --run_name (or delete {path}) to start over.")
        dataset = read_source(settings.dataset_file, max_samples=settings.max_samples,
                              skip_bad=settings.skip_bad_lines, attempts=settings.attempts)
        for problem in dataset.problems:
            log.warning("skipped bad line: %s", problem)
        lock = rundir.RunLock(path)
        lock.acquire()
        sandboxes = None
        try:
            ctx = RunContext.create(settings, run_id=settings.run_name, api_key=api_key, worker=owner_label())
            # The backend's part of a run's start: what dead invocations left goes, limits are
            # checked, and from now on a signal removes the run's sandboxes first. A run none of
            # whose toolsets needs a sandbox spends no container, not even a limit probe. On a Dask
            # cluster each worker does this for its own machine (hermes.run.remote), not this process.
            if ctx.uses_sandbox and not settings.dask_address:
                try:
                    sandboxes = ctx.backend.open_run(settings.run_name)
                except WeakerSandbox as e:
                    raise rundir.RunRefused(f"run '{settings.run_name}' refused: {e}") from None
            if ctx.uses_sandbox and (asked := task_rows.limits_summary(dataset, settings, ctx.backend)):
                log.info("%s", asked)  # task folders: what they ask and get, one line for all
            index = RunIndex(path, lean=True, memory=RUN_MEMORY)
            index.load_dataset(dataset)
            rundir.write_manifest(path, settings, total_prompts=dataset.prompts)
        except BaseException:
            try:
                if sandboxes:
                    sandboxes.close()
            finally:
                lock.release()
            raise
        return cls(settings=settings, path=path, dataset=dataset, index=index, lock=lock, ctx=ctx,
                   sandboxes=sandboxes)

    def plan(self) -> "Plan | PolicyPlan":
        """The rows still owed, re-batched; numbering continues after the batches on disk.

        DuckDB joins the dataset's keys with the journal's outcomes and numbers the rows owed; a
        batch's (index, key) pairs are read off the index as the plan is walked (Plan), and its
        rows' text when it is handed out (Batch.rows).
        """
        max_attempts = self.settings.max_attempts
        if max_attempts and (given_up := self.index.given_up(max_attempts)):
            log.warning("%d prompt(s) failed %d times and are not retried (--max_attempts)", given_up, max_attempts)
        prompts = self.index.plan_owed(max_attempts)
        policy = AttemptPolicy.of(self.settings)
        if policy.dynamic:  # attempts planned as their verdicts land (hermes.run.waves)
            plan = PolicyPlan(self.index, self.dataset, policy, batch=Batch, first=self.index.next_batch_num(),
                              size=self.settings.batch_size, prompts=prompts,
                              lookahead=OWED_CHUNK,  # as a static plan reads them: a chunk at a time
                              refresh=self._index_landed, stop=self.ctx.stop_attempts)
            log.info("run '%s': attempt policy %s (up to %d attempts a task%s), %d attempt(s) open",
                     self.settings.run_name, policy.name, policy.k,
                     f", budget {policy.budget}" if policy.budget is not None else "", prompts)
            self.write_checkpoint()
            return plan
        plan = Plan(self.index, self.dataset, first=self.index.next_batch_num(), size=self.settings.batch_size,
                    prompts=prompts)
        total = self.dataset.prompts  # every attempt of every row (--attempts)
        log.info("run '%s': %d prompts, %d already done, %d owed in %d batch(es)",
                 self.settings.run_name, total, total - plan.prompts, plan.prompts, len(plan))
        self.write_checkpoint()
        return plan

    def record(self, batch: Batch) -> None:
        """A batch finished: index its file (with the others landed within INDEX_INTERVAL) and bring
        checkpoint.json up to date (at most every few seconds)."""
        self._landed.append((batch.num, batch.wanted))
        self.prompts_run += batch.size
        now = time.monotonic()
        if now - self._indexed_at >= INDEX_INTERVAL:
            self._index_landed()
        if now - self._checkpoint_at >= CHECKPOINT_INTERVAL:
            self.write_checkpoint()

    def _index_landed(self) -> None:
        landed, self._landed = self._landed, []
        files = [(num, path) for num, _ in landed if (path := RunPaths(self.path).batch(num)).exists()]
        if files:
            done = set(self.index.index_batches(files))
            if self._completed is not None:
                bitmap.add(self._completed, (i for _, wanted in landed for i, key in wanted if key in done))
        self._indexed_at = time.monotonic()

    def write_checkpoint(self) -> None:
        self._index_landed()  # the checkpoint is read off the index
        if self._completed is None:
            self._completed = self.index.completed_bitmap(len(self.dataset))
        # A pass over every batch: throttled, so a run of many small batches stays linear.
        rundir.write_checkpoint(self.path, self.settings.run_name, bitmap.chunks(self._completed),
                                self.index.batch_stats())
        self._checkpoint_at = time.monotonic()

    def close(self) -> None:
        try:
            self.write_checkpoint()
            rundir.log_invocation(self.path, self.started, datetime.now(), self.prompts_run)
            self.index.close()
            self.ctx.close()
        finally:
            # Prompts hand their sandboxes to background removers; the run ends when they are gone
            # (what is still left then goes at process exit, or with the next run's clean-up).
            try:
                if self.sandboxes:
                    self.sandboxes.close(timeout=120.0)
                    if local_processes.processes_for(self.settings) > 1:
                        # this machine's worker processes are gone by now: what a killed one left goes too
                        try:
                            self.ctx.backend.cleanup(self.settings.run_name)
                            forget_dead_workers(self.path)  # what their files counted just went
                        except Exception as e:  # the run's outputs stand; the next start sweeps again
                            log.warning("could not sweep the worker processes' containers: %s", e)
                remote.sweep_after_run(self.settings, self.ctx)  # a Dask run's: every worker sweeps its host
            finally:
                self.lock.release()
