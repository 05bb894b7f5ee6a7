"""A batch run in another process than the run's own: a Dask worker, on this machine or another.

What reaches the worker is plain data (a RunOrder: the settings, the run folder's path on the
shared storage, the prefill messages; and the batch's rows). Each worker process builds its own
RunContext once per run and keeps it (model client, its machine's sandbox backend, a limiter of
`num_workers` prompts in flight IN THIS WORKER PROCESS), so a cluster of W workers runs up to
W x num_workers prompts at once. The flow's process keeps the run's index, lock and outputs.

A batch rerun after its worker died (Dask reschedules the task elsewhere) first reads its batch
file: prompts with a line there are finished and are not run again, a torn last line is closed
off, and the prompts the dead worker was running run again (their line was never written).
Each worker also keeps workers/<host>_<pid>.json in the run folder up to date with how many of
its prompts are in flight: what a dead worker's file still counts may have left containers on
its host (hermes.status reports them; that host's next start of the run, or
`hermes-batch sandbox cleanup`, removes them). Plain Python, no Prefect, no Dask.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from hermes import journal, runner
from hermes.dataset import Row
from hermes.entry import Status
from hermes.sandbox import SandboxRun
from hermes.sandbox.lifecycle import owner_alive, owner_label
from hermes.settings import RunSettings

log = logging.getLogger(__name__)
WORKERS_DIR = "workers"


class RunOrder(BaseModel):
    """What every batch of a run carries to its worker: plain data only, no handles."""

    model_config = ConfigDict(extra="forbid")

    settings: RunSettings
    #: the run folder on storage every worker reaches, as an absolute path (same mount point everywhere)
    run_dir: str
    prefill: list[dict[str, Any]] = []

    @classmethod
    def of(cls, ctx: runner.RunContext) -> "RunOrder":
        """The order for the run this (the flow's) context is of: its run folder made absolute."""
        return cls(settings=ctx.settings, run_dir=str(ctx.run_dir.resolve()), prefill=ctx.prefill)


class InFlight:
    """The worker's limiter (a BoundedSemaphore of num_workers), also counting the prompts in
    flight into the worker's file in the run folder, so that what a killed worker left is known."""

    def __init__(self, num_workers: int, path: Path, worker: str, sandboxed: bool):
        self._sem = threading.BoundedSemaphore(num_workers)
        self._lock = threading.Lock()
        self.path = path
        self.worker = worker
        self.sandboxed = sandboxed  # a run whose prompts make no container leaves none behind
        self.count = 0
        self._write()

    def acquire(self) -> bool:
        self._sem.acquire()
        self._change(+1)
        return True

    def release(self) -> None:
        self._change(-1)
        self._sem.release()

    def _change(self, delta: int) -> None:
        with self._lock:
            self.count += delta
            self._write()

    def _write(self) -> None:
        host, _, pid = self.worker.rpartition(":")
        data = {"worker": self.worker, "host": host, "pid": int(pid), "in_flight": self.count,
                "sandboxed": self.sandboxed, "updated": time.time()}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        # No fsync: it must survive the process being killed (the page cache does), not the machine.
        try:
            tmp.write_text(json.dumps(data), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as e:  # a prompt must never fail over its bookkeeping
            log.warning("could not write %s: %s", self.path, e)


class _WorkerRun:
    def __init__(self, fingerprint: str, ctx: runner.RunContext, sandboxes: SandboxRun | None):
        self.fingerprint = fingerprint
        self.ctx = ctx
        self.sandboxes = sandboxes

    def close(self) -> None:
        try:
            self.ctx.close()
        finally:
            if self.sandboxes:
                self.sandboxes.close(timeout=60.0)


_runs: dict[str, _WorkerRun] = {}
_runs_lock = threading.Lock()


def worker_file(run_dir: Path, worker: str) -> Path:
    return run_dir / WORKERS_DIR / (worker.replace(":", "_").replace("/", "_") + ".json")


def context_for(order: RunOrder, api_key: str | None = None) -> runner.RunContext:
    """This process's RunContext for the order's run, built on first use and kept.

    A new invocation of the run with other settings (a resume with another num_workers) gets a
    new one; the old one is closed.
    """
    run_dir = Path(order.run_dir)
    fingerprint = order.model_dump_json() + (api_key or "")
    with _runs_lock:
        have = _runs.get(order.run_dir)
        if have and have.fingerprint == fingerprint:
            return have.ctx
        if have:
            _runs.pop(order.run_dir).close()
        settings = order.settings.model_copy(update={"prefill_messages_file": None})  # sent as data
        worker = owner_label()
        (run_dir / WORKERS_DIR).mkdir(parents=True, exist_ok=True)
        ctx = runner.RunContext.create(settings, run_id=settings.run_name, api_key=api_key, worker=worker)
        ctx.run_dir, ctx.prefill = run_dir, list(order.prefill)
        ctx.limiter = InFlight(settings.num_workers, worker_file(run_dir, worker), worker, ctx.uses_sandbox)
        sandboxes = None
        if ctx.uses_sandbox:
            # This machine's part of the run's start: containers dead workers of the run left on
            # this host go, limits are checked (WeakerSandbox fails the batch, naming them).
            try:
                sandboxes = ctx.backend.open_run(settings.run_name)
            except BaseException:
                ctx.close()
                raise
        forget_dead_workers(run_dir)
        _runs[order.run_dir] = _WorkerRun(fingerprint, ctx, sandboxes)
        return ctx


def forget_dead_workers(run_dir: Path) -> None:
    """Worker files of dead processes on this host: their containers were just removed."""
    for path in (run_dir / WORKERS_DIR).glob("*.json"):
        info = _read_worker(path)
        if info and owner_alive(info.get("worker")) is False:
            path.unlink(missing_ok=True)


def _read_worker(path: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def finished_keys(path: Path) -> set[str]:
    """Keys with a line in this batch file (whatever the outcome: a failed one waits for --resume)."""
    if not path.exists():
        return set()
    return {k for e in journal.read(path) if isinstance(k := (e.get("hermes") or {}).get("key"), str)}


def run_batch(batch_num: int, rows: list[Row], order: RunOrder, api_key: str | None = None) -> dict[str, int]:
    """Run what a batch still owes in this process; its finished prompts are not run again."""
    ctx = context_for(order, api_key)
    path = ctx.run_dir / f"batch_{batch_num}.jsonl"
    journal.seal(path)  # a torn last line of a dead worker must not swallow our first line
    done = finished_keys(path)
    todo = [r for r in rows if r.key not in done]
    if done:
        log.warning("batch %d rerun on %s: %d prompt(s) finished before are skipped, %d run",
                    batch_num, ctx.worker, len(rows) - len(todo), len(todo))
    counts = runner.run_batch(batch_num, todo, ctx) if todo else {str(s): 0 for s in Status}
    # The batch ends when its containers are gone, not merely handed to the background removers.
    if not ctx.backend.drain(60.0):
        log.warning("batch %d: some containers on %s are still being removed", batch_num, socket.gethostname())
    return counts


def left_behind(run_dir: Path) -> list[dict[str, Any]]:
    """Workers whose file still counts prompts in flight: each may have left that many containers
    on its host. `alive` is True/False for this host's processes, None for another host's."""
    found = []
    for path in sorted((run_dir / WORKERS_DIR).glob("*.json")):
        info = _read_worker(path)
        if info and info.get("in_flight") and info.get("sandboxed", True):
            found.append({"host": info.get("host"), "pid": info.get("pid"), "worker": info.get("worker"),
                          "in_flight": info["in_flight"], "alive": owner_alive(info.get("worker"))})
    return found
