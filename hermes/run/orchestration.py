"""The life of one run invocation, whichever engine carries it out (the Prefect flow or `--engine direct`).

    open (refuse/resume, lock, validate) -> plan what is owed -> fan batches out (prompts in
    flight bounded by --num_workers) -> record each batch as it lands -> merge -> fail the run
    if too many prompts failed

`run` is that sequence and nothing else. `Steps` says how each step is carried out: its
defaults are plain calls, each batch a coroutine on the run's loop (the direct engine,
hermes/run/direct.py); the Prefect flow (flows/batch.py, tasks/steps.py) runs its batches the same
way and adds task runs for plan, merge and report, its Dask task runner for batches that leave
the process, progress artifacts and a way on when its API goes away. A run started one way
resumes the other way: the journal, index, checkpoint and outputs are the same. Nothing here imports Prefect.

With settings.dask_address the batches run on a Dask cluster's workers (hermes/run/remote.py), and
with --worker_processes N on worker processes of this machine (hermes/run/local_processes.py): they
get plain data, not this process's run context, and progress is counted from the journal as it
lands (progress.JournalTail) instead of from callbacks here.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import gc
import itertools
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol

from hermes.run import clusters, endpoint, local_processes, merge, rundir
from hermes.run import publish_command, remote, runner
from hermes.data.outcome import check_failed_share
from hermes.run import tool_use
from hermes.run.admission import Admission
from hermes.run.progress import JournalTail, ProgressLine
from hermes.run.rundir import RunRefused
from hermes.run.session import Batch, Plan, RunSession
from hermes.run.waves import WAIT, PolicyPlan
from hermes.settings import RunSettings


class BatchFuture(Protocol):
    """What a fanned-out batch hands back: concurrent.futures and Prefect futures both fit."""

    def result(self) -> Any: ...


#: submit(batch, ctx) starts one batch and returns its future
Submit = Callable[[Batch, runner.RunContext], BatchFuture]


class Steps:
    """How the steps of a run are carried out. These defaults run them in this process, on threads."""

    def check(self, settings: RunSettings) -> None:
        """Refuse, before anything starts, what these steps cannot carry out."""
        if clusters.of(settings).elsewhere:
            raise RunRefused(f"--engine direct runs every batch in this process and cannot start Dask workers "
                             f"(cluster {settings.cluster}): run with the Prefect engine")
        if settings.dask_address:
            raise RunRefused(
                f"--engine direct runs every batch in this process and cannot use a Dask cluster "
                f"(dask_address {settings.dask_address}, from --dask_address or $HERMES_DASK_ADDRESS): "
                f"run with the Prefect engine, or unset the address")

    def plan(self, session: RunSession) -> Plan:
        return session.plan()

    def progress(self, run_name: str, total: int) -> Callable[[dict[str, Any]], None]:
        """The callback fed one journal entry per finished prompt."""
        return ProgressLine(total).prompt_done

    @contextlib.contextmanager
    def fan_out(self, settings: RunSettings) -> Iterator[Submit]:
        if local_processes.processes_for(settings) > 1:
            order = remote.order_once()
            with local_processes.cluster(settings) as pool:
                # the key as this process resolved it (an argument of direct.run, or the environment)
                yield lambda batch, ctx: pool.submit(remote.run_batch, batch.num, batch.rows, order(ctx),
                                                     ctx.client.api_key, key=f"batch-{batch.num}")
            return
        # Batches as coroutines on the run's loop (no thread each), handed out as the run's slots
        # can take their prompts (landing). As a pool's end would, the end waits for every batch.
        running: set[concurrent.futures.Future] = set()

        def submit(batch: Batch, ctx: runner.RunContext) -> concurrent.futures.Future:
            future = runner.start_batch(batch.num, batch.rows, ctx)
            running.add(future)
            future.add_done_callback(running.discard)
            return future
        try:
            yield submit
        finally:
            concurrent.futures.wait(list(running))

    def as_completed(self, futures: Iterable[BatchFuture]) -> Iterator[BatchFuture]:
        return concurrent.futures.as_completed(futures)  # type: ignore[arg-type]

    def outcome(self, batch: Batch, future: BatchFuture, ctx: runner.RunContext) -> Any:
        """A landed batch's outcome; raises what the batch raised."""
        return future.result()

    def record(self, session: RunSession, batch: Batch) -> None:
        session.record(batch)

    def merge(self, run_path: Path, max_failed_share: float) -> dict[str, Any]:
        return merge.merge(run_path)


#: allocations between two collections of the youngest generation (Python's default: 700)
GC_YOUNG = 10_000


@contextlib.contextmanager
def collector_for_a_run() -> Iterator[None]:
    """The cyclic garbage collector, tuned for hundreds of prompts in flight.

    At the default threshold the collector ran about 1,400 times in a run of 2048 prompts at
    512 workers, each time walking the conversations in flight and the modules loaded (Prefect,
    the SDK's types), holding the interpreter lock: about a fifth of the process's CPU (perf).
    What is loaded before the run is frozen out of the collector's walks, and the youngest
    generation is collected 14 times less often; garbage without cycles is freed at once either
    way (reference counts). bench/THROUGHPUT.md, "Workload 4: where the time goes".
    """
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(GC_YOUNG, threshold[0]), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def landing(batches: Iterable[Batch], submit: Submit, ctx: runner.RunContext,
            steps: Steps) -> Iterator[tuple[Batch, BatchFuture]]:
    """Hand the batches out and yield each as it lands, with its future.

    In this process (ctx.admission set) a batch is handed out only when the prompts already
    handed out can no longer keep the slots busy (hermes.run.admission), so the batches started at
    any moment are a few, however long the dataset. Batches that run elsewhere (Dask, worker
    processes) are handed out at once: their workers queue them and hold their own slots.
    """
    admission = ctx.admission
    if admission is None:
        yield from _landing_elsewhere(batches, submit, ctx, steps)
        return
    owed = iter(batches)
    pending: dict[Any, Batch] = {}
    landed: collections.deque = collections.deque()
    exhausted = False
    waiting = False  # the plan (an attempt policy's) has nothing to start until a batch lands

    def on_done(future: Any) -> None:
        landed.append(future)
        admission.wake()

    def hand_out() -> None:
        nonlocal exhausted, waiting
        # With nothing in flight a batch goes out whatever the count says: a run never ends,
        # nor stalls, with batches owed.
        while not exhausted and not waiting and (admission.wants_more() or not pending):
            batch = next(owed, None)
            if batch is None:
                exhausted = True
                return
            if batch is WAIT:
                waiting = True
                return
            admission.handed_out(batch.size)
            future = submit(batch, ctx)
            pending[future] = batch
            future.add_done_callback(on_done)

    hand_out()
    while pending:
        admission.wait_for(lambda: bool(landed) or (not exhausted and not waiting and admission.wants_more()))
        hand_out()
        while landed:
            future = landed.popleft()
            yield pending.pop(future), future
            waiting = False  # what landed may let the plan start more
            # While the caller recorded that batch, others may have landed and freed their slots:
            # look again before the next, or the last of them would end the loop with batches owed.
            hand_out()
    # nothing left to wait for: every batch was handed out and has landed


def _landing_elsewhere(batches: Iterable[Batch], submit: Submit, ctx: runner.RunContext,
                       steps: Steps) -> Iterator[tuple[Batch, BatchFuture]]:
    """landing() for batches that run in other processes: every batch the plan has goes out at once
    (their workers queue them). A plan that makes batches as verdicts land (WAIT: nothing until a
    batch lands) is walked again after each landing, its new batches going out at once and watched
    as the next round once the current one has landed."""
    owed = iter(batches)
    exhausted = False

    def hand_out() -> dict[Any, Batch]:
        nonlocal exhausted
        out: dict[Any, Batch] = {}
        while not exhausted:
            batch = next(owed, None)
            if batch is None:
                exhausted = True
            elif batch is WAIT:
                break
            else:
                out[submit(batch, ctx)] = batch
        return out

    futures = hand_out()
    while futures:
        later: dict[Any, Batch] = {}
        for future in steps.as_completed(list(futures)):
            yield futures.pop(future), future
            later.update(hand_out())
        futures = later


def run(settings: RunSettings, steps: Steps | None = None, *, api_key: str | None = None) -> dict[str, Any]:
    """One invocation of a run, start to end; returns the run's statistics (statistics.json).

    Raises RunRefused (before anything ran) or TooManyFailedPrompts (after the outputs were written).
    """
    steps = steps or Steps()
    steps.check(settings)
    # --cluster: workers started for the run (Slurm jobs) live as long as this block; inside it the
    # run is the Dask path, its settings carrying their scheduler's address
    with clusters.of(settings).started(settings, rundir.run_dir(settings)) as settings, collector_for_a_run():
        return _run(settings, steps, api_key=api_key)


def _run(settings: RunSettings, steps: Steps | None, *, api_key: str | None) -> dict[str, Any]:
    steps = steps or Steps()
    steps.check(settings)
    publish_command.check_settings(settings)  # a bad --publish is refused before anything runs
    settings = endpoint.checked(settings, api_key)  # a dead endpoint refuses the run here, nothing journaled
    endpoint.warn_if_sampling_changed(settings)
    session = RunSession.open(settings, api_key=api_key)
    breaker = session.ctx.client.breaker
    down: list[str] = []  # what the breakers of the processes running batches said, if one opened
    tail = None
    publisher = publish_command.NoPublisher()
    try:
        publisher = publish_command.start(settings, session.path)  # its own process: off the prompts' path
        batches = steps.plan(session)
        on_done = steps.progress(settings.run_name, batches.prompts)
        if local_processes.elsewhere(settings):  # prompts finish in other processes: count them from the journal
            dynamic = isinstance(batches, PolicyPlan)  # an attempt policy's batches are numbered as made
            tail = JournalTail(session.path, [] if dynamic else range(batches.first, batches.first + len(batches)),
                               on_done).start()
            if dynamic:
                batches.on_batch = lambda num: tail.watch([num])
        else:
            session.ctx.on_prompt_done = on_done
            if isinstance(batches, PolicyPlan):  # a pass stops its siblings as soon as it is written
                session.ctx.on_prompt_done = lambda record: (on_done(record), batches.verdict(record))
            session.ctx.admission = Admission(ahead=settings.num_workers)
        with steps.fan_out(settings) as submit:
            # once the breaker opened no more batches go out: what is not done stays owed
            owed = itertools.takewhile(lambda _: not (breaker.open or down), batches)
            for batch, future in landing(owed, submit, session.ctx, steps):
                steps.record(session, batch)  # index it as soon as it lands, whatever else fails
                if isinstance(batches, PolicyPlan):
                    batches.landed(batch.num)  # its verdicts may start (or stop) other attempts
                publisher.landed(batch.num)  # a few bytes into a pipe, never a wait
                if tail:
                    tail.finish(batch.num)
                outcome = steps.outcome(batch, future, session.ctx)
                if isinstance(outcome, dict) and outcome.get("endpoint_down"):
                    down.append(outcome["endpoint_down"])  # a worker's breaker opened
                batch.release()  # its rows' text: only the batches in flight keep theirs
        publisher.finish_soon()  # the last shard and compaction go out while the session closes
    except BaseException:
        publisher.abandon()  # it publishes what landed and ends; the next start does the rest
        raise
    finally:
        if tail:
            tail.stop()
        session.close()
    publisher.finish()  # the rest, compacted; the report (in merge) reads its summary from the run folder
    stats = steps.merge(session.path, settings.max_failed_share)
    endpoint.raise_if_down(breaker, stats, session.path, down)
    check_failed_share(stats, settings.max_failed_share, session.path)
    tool_use.report(stats)  # agents that never acted: said loudly (hermes.run.tool_use)
    tool_use.check_no_tool_use_share(stats, settings.max_no_tool_use_share, session.path)
    return stats
