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

import logging
import socket
import threading
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from hermes import journal, local_processes, runner
from hermes.dataset import Row
from hermes.entry import Status
from hermes.sandbox import SandboxRun
from hermes.sandbox.lifecycle import owner_label
from hermes.workerfiles import WORKERS_DIR, InFlight, forget_dead_workers, worker_file
from hermes.settings import RunSettings

log = logging.getLogger(__name__)


class RunOrder(BaseModel):
    """What every batch of a run carries to its worker: plain data only, no handles."""

    model_config = ConfigDict(extra="forbid")

    settings: RunSettings
    #: the run folder on storage every worker reaches, as an absolute path (same mount point everywhere)
    run_dir: str
    prefill: list[dict[str, Any]] = []

    @classmethod
    def of(cls, ctx: runner.RunContext) -> "RunOrder":
        """The order for the run this (the flow's) context is of: its run folder made absolute.
        Worker processes of this machine (hermes.local_processes) each get their share of
        num_workers; a Dask cluster's workers each get all of it."""
        settings = ctx.settings
        if local_processes.processes_for(settings) > 1:
            settings = settings.model_copy(update={"num_workers": local_processes.share(settings)})
        return cls(settings=settings, run_dir=str(ctx.run_dir.resolve()), prefill=ctx.prefill)


def order_once() -> Callable[[runner.RunContext], RunOrder]:
    """RunOrder.of(ctx), made at the first batch and handed to every later one (the same plain data)."""
    made: list[RunOrder] = []

    def order(ctx: runner.RunContext) -> RunOrder:
        if not made:
            made.append(RunOrder.of(ctx))
        return made[0]
    return order


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
        ctx.in_flight = InFlight(worker_file(run_dir, worker), worker, ctx.uses_sandbox)
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


def finished_keys(path: Path) -> set[str]:
    """Keys with a final line in this batch file (whatever the outcome: a failed one waits for
    --resume). A failed attempt put back in the queue (requeued) is not final: its retry may have
    died with the worker, so the prompt runs again."""
    if not path.exists():
        return set()
    return {k for e in journal.read(path)
            if isinstance(k := (e.get("hermes") or {}).get("key"), str) and not e["hermes"].get("requeued")}


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
