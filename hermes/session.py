"""One invocation of a run: refuse or resume, lock the folder, plan what is owed, record batches.

Plain Python; tasks/ and flows/ put Prefect around it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from hermes import local_processes, rundir
from hermes.dataset import Dataset, Row, read_dataset
from hermes.runner import RunContext
from hermes.sandbox import SandboxRun, WeakerSandbox, get_backend
from hermes.sandbox.lifecycle import owner_label
from hermes.settings import RunSettings
from hermes.workerfiles import forget_dead_workers
from hermes.run_index import RunIndex

log = logging.getLogger(__name__)
CHECKPOINT_INTERVAL = 5.0  # seconds between checkpoint.json rewrites while batches land
#: seconds between index updates while batches land. Indexing one batch at a time cost about 9 ms
#: of the interpreter's time each, taken from the prompts in flight (512 batches of a 2048-prompt
#: run: 4.6 s). The journal is the truth: a file landed but not yet indexed when the process dies
#: is indexed by the next start, which compares each file's size with the index's.
INDEX_INTERVAL = 1.0


@dataclass
class Batch:
    num: int
    rows: list[Row]


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
    _landed: list[tuple[int, Path]] = field(default_factory=list)

    @classmethod
    def open(cls, settings: RunSettings, api_key: str | None = None) -> "RunSession":
        path = rundir.run_dir(settings)
        if rundir.has_results(path) and not settings.resume:
            raise rundir.RunRefused(
                f"run '{settings.run_name}' already has results in {path}. "
                f"Pass --resume (resume: true in a deployment or UI run) to continue it, "
                f"or choose a new --run_name (or delete {path}) to start over.")
        dataset = read_dataset(settings.dataset_file, max_samples=settings.max_samples,
                               skip_bad=settings.skip_bad_lines)
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
            # cluster each worker does this for its own machine (hermes.remote), not this process.
            if ctx.uses_sandbox and not settings.dask_address:
                try:
                    sandboxes = ctx.backend.open_run(settings.run_name)
                except WeakerSandbox as e:
                    raise rundir.RunRefused(f"run '{settings.run_name}' refused: {e}") from None
            index = RunIndex(path)
            index.load_dataset(dataset)
            rundir.write_manifest(path, settings, total_prompts=len(dataset))
        except BaseException:
            try:
                if sandboxes:
                    sandboxes.close()
            finally:
                lock.release()
            raise
        return cls(settings=settings, path=path, dataset=dataset, index=index, lock=lock, ctx=ctx,
                   sandboxes=sandboxes)

    def plan(self) -> list[Batch]:
        """The rows still owed, re-batched; numbering continues after the batches on disk.

        DuckDB joins the dataset's keys with the journal's outcomes; only owed rows become Rows.
        """
        max_attempts = self.settings.max_attempts
        if max_attempts and (given_up := self.index.given_up(max_attempts)):
            log.warning("%d prompt(s) failed %d times and are not retried (--max_attempts)", given_up, max_attempts)
        owed = self.dataset.rows(self.index.owed(max_attempts))
        first = self.index.next_batch_num()
        size = self.settings.batch_size
        batches = [Batch(first + i, owed[j:j + size]) for i, j in enumerate(range(0, len(owed), size))]
        total = len(self.dataset)
        log.info("run '%s': %d prompts, %d already done, %d owed in %d batch(es)",
                 self.settings.run_name, total, total - len(owed), len(owed), len(batches))
        self.write_checkpoint()
        return batches

    def record(self, batch: Batch) -> None:
        """A batch finished: index its file (with the others landed within INDEX_INTERVAL) and bring
        checkpoint.json up to date (at most every few seconds)."""
        path = self.path / f"batch_{batch.num}.jsonl"
        if path.exists():
            self._landed.append((batch.num, path))
        self.prompts_run += len(batch.rows)
        now = time.monotonic()
        if now - self._indexed_at >= INDEX_INTERVAL:
            self._index_landed()
        if now - self._checkpoint_at >= CHECKPOINT_INTERVAL:
            self.write_checkpoint()

    def _index_landed(self) -> None:
        landed, self._landed = self._landed, []
        if landed:
            self.index.index_batches(landed)
        self._indexed_at = time.monotonic()

    def write_checkpoint(self) -> None:
        self._index_landed()  # the checkpoint is read off the index
        # A join over the whole dataset: throttled, so a run of many small batches stays linear.
        rundir.write_checkpoint(self.path, self.settings.run_name, self.index.completed_json(),
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
            finally:
                self.lock.release()
