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
its host (hermes.run.status reports them; that host's next start of the run, or
`hermes-batch sandbox cleanup`, removes them). Plain Python, no Prefect, no Dask.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from hermes.data.run_paths import RunPaths
from hermes.data import journal
from hermes.run import local_processes, runner
from hermes.data.dataset import Row
from hermes.data.entry import Status
from hermes.sandbox import SandboxRun
from hermes.sandbox.lifecycle import owner_label
from hermes.run.workerfiles import InFlight, forget_dead_workers, worker_file
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
        Worker processes of this machine (hermes.run.local_processes) each get their share of
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
        RunPaths(run_dir).workers.mkdir(parents=True, exist_ok=True)
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


def owed_rows(run_dir: Path, batch_num: int, rows: list[Row], where: str | None = None) -> list[Row]:
    """The rows of a batch run before (a dead worker's, a retried task's) that its journal lacks."""
    path = RunPaths(run_dir).batch(batch_num)
    journal.seal(path)  # a torn last line of a dead process must not swallow our first line
    done = finished_keys(path)
    todo = [r for r in rows if r.key not in done]
    if done:
        log.warning("batch %d rerun on %s: %d prompt(s) finished before are skipped, %d run",
                    batch_num, where or socket.gethostname(), len(rows) - len(todo), len(todo))
    return todo


def run_batch(batch_num: int, rows: list[Row], order: RunOrder, api_key: str | None = None) -> dict[str, int]:
    """Run what a batch still owes in this process; its finished prompts are not run again."""
    ctx = context_for(order, api_key)
    sweep_now_and_then(ctx)  # what a killed worker left here goes during the run
    todo = owed_rows(ctx.run_dir, batch_num, rows, ctx.worker)
    counts = runner.run_batch(batch_num, todo, ctx) if todo else {str(s): 0 for s in Status}
    # The batch ends when its containers are gone, not merely handed to the background removers.
    if not ctx.backend.drain(60.0):
        log.warning("batch %d: some containers on %s are still being removed", batch_num, socket.gethostname())
    return counts


#: seconds between two sweeps of dead processes' sandboxes by one worker process's batches
SWEEP_INTERVAL = 10.0
_swept_at = [float("-inf")]


def sweep_now_and_then(ctx: runner.RunContext) -> None:
    """A worker killed mid-run left its prompts' sandboxes on its host: the batches of the live
    workers there remove them (whatever their run, at most every SWEEP_INTERVAL s), so they do
    not wait for the run's end."""
    if not ctx.uses_sandbox:
        return
    now = time.monotonic()
    with _runs_lock:
        if now - _swept_at[0] < SWEEP_INTERVAL:
            return
        _swept_at[0] = now
    try:
        if ctx.backend.sweep_dead():
            forget_dead_workers(ctx.run_dir)  # what their files counted just went
    except Exception as e:  # noqa: BLE001 - costs the batch nothing: the run's end sweeps again
        log.warning("could not sweep dead processes' sandboxes on %s: %s", socket.gethostname(), e)


def end_of_run(run_dir: str) -> int:
    """Run in every worker process when the run ends (sweep_after_run, by Dask's client.run): its
    hold on the run is released (the backend's end_run: removals drained, strays of its own
    removed) unless a prompt of it is still in flight here, and the sandboxes of dead processes
    on this host go, whatever their run. Returns how many of those went."""
    with _runs_lock:
        have = _runs.get(run_dir)
        if have is None or have.ctx.in_flight.count:
            have = None
        else:
            _runs.pop(run_dir)
    removed = 0
    try:
        if have is not None:
            backend, sandboxed = have.ctx.backend, have.ctx.uses_sandbox
            have.close()
            if sandboxed:
                removed = backend.sweep_dead()
        if Path(run_dir).is_dir():
            forget_dead_workers(Path(run_dir))
    except Exception as e:  # noqa: BLE001 - reported, not raised: the run's outputs stand
        log.warning("could not sweep dead processes' sandboxes on %s: %s", socket.gethostname(), e)
    return removed


def sweep_after_run(settings: RunSettings, ctx: runner.RunContext) -> None:
    """The run ends: no sandbox of a dead process is left on any host a live Dask worker (or this,
    the flow's, process) reaches. Every worker the scheduler knows runs end_of_run (Dask's own
    client.run: no list of workers of ours), then this process sweeps its own host."""
    if not settings.dask_address or not ctx.uses_sandbox:
        return
    try:
        from distributed import Client

        with Client(settings.dask_address, timeout=30) as client:
            removed = client.run(end_of_run, str(ctx.run_dir.resolve()))
        if sum(removed.values()):
            log.warning("run '%s': the Dask workers removed %d sandbox(es) of dead processes at the run's end",
                        settings.run_name, sum(removed.values()))
    except Exception as e:  # noqa: BLE001 - the outputs stand; every worker's next start sweeps again
        log.warning("run '%s': could not have the Dask workers sweep at its end: %s", settings.run_name, e)
    try:
        ctx.backend.sweep_dead()
    except Exception as e:  # noqa: BLE001
        log.warning("run '%s': could not sweep dead processes' sandboxes here: %s", settings.run_name, e)
