"""--cluster slurm: the run's Dask workers as Slurm jobs, through dask-jobqueue's SLURMCluster.

The run's own process keeps the Dask scheduler (in-process, as dask-jobqueue starts it), the run's
lock, its DuckDB index and its outputs; the jobs are Dask workers (one process each, slurm_cores
batches at once, num_workers prompts in flight) that reach the run folder on shared storage and
their node's sandbox engine, exactly as the workers of a --dask_address cluster do
(hermes.run.remote: a batch whose job was cancelled, preempted or timed out reruns on another,
its finished prompts not run again).

How many jobs: Dask's own adaptive scaling (between 0 and slurm_max_jobs), told that a batch is
long work (the scheduler's unknown-task-duration), so that every batch waiting asks for a worker
thread until the first batches have landed and taught it their real length; idle workers are
retired and their jobs ended, none are left once the run is done.

Which jobs are whose: every job is named `hermes-<run_name>` and carries the comment
`hermes-owner=<host>:<pid>` of the process that holds its scheduler. The run's end, failure or a
SIGINT/SIGTERM cancels them (SLURMCluster.close, then scancel of any it missed). A process killed
with SIGKILL cannot: its workers lose their scheduler and exit after death_timeout, and at worst
the job ends at its walltime; until then the next run's start, or `hermes-batch sandbox cleanup`,
on the same host cancels the jobs whose owner is no longer alive (hermes.sandbox.lifecycle's
owner_alive, with the job's submit time against pid reuse).
"""
from __future__ import annotations

import contextlib
import datetime as dt
import logging
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from hermes.sandbox.lifecycle import RunGuard, owner_alive, owner_label
from hermes.settings import RunSettings

log = logging.getLogger(__name__)

JOB_PREFIX = "hermes-"
OWNER_PREFIX = "hermes-owner="
#: the scheduler's guess at a task it has not seen finish yet: a batch is minutes of work, so every
#: batch waiting counts as a worker thread wanted (Dask's default, half a second, would ask for one
#: job for dozens of batches)
BATCH_DURATION_GUESS = "1h"
#: seconds a worker without its scheduler waits before it exits (and its job ends)
DEATH_TIMEOUT = 60
#: seconds the run's end waits for its cancelled jobs to leave the queue (Slurm's KillWait and epilog)
GONE_TIMEOUT = 60.0
#: squeue states of a job already on its way out: cancelling it again does nothing
ENDING = frozenset({"COMPLETING", "CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL"})


class Job(NamedTuple):
    id: str
    name: str
    owner: str | None
    submitted: float | None  # epoch seconds
    state: str = ""  # squeue's: PENDING, RUNNING, COMPLETING, ...


def job_name(run_name: str) -> str:
    return f"{JOB_PREFIX}{run_name}"


def cluster_kwargs(settings: RunSettings, log_dir: Path) -> dict[str, Any]:
    """SLURMCluster's arguments for the run (its worker jobs' #SBATCH lines and command)."""
    # no dashboard; the scheduler's HTTP routes (health, metrics) on loopback only, any free port:
    # left unset they would listen on every interface at 8787
    scheduler: dict[str, Any] = {"dashboard": False, "dashboard_address": "127.0.0.1:0"}
    if settings.slurm_scheduler_host:
        scheduler["host"] = settings.slurm_scheduler_host
    return {
        "job_name": job_name(settings.run_name),
        "queue": settings.slurm_partition, "account": settings.slurm_account,
        "walltime": settings.slurm_walltime, "cores": settings.slurm_cores, "processes": 1,
        "memory": settings.slurm_memory, "python": settings.slurm_python or sys.executable,
        "job_extra_directives": [f"--comment={OWNER_PREFIX}{owner_label()}",
                                 *shlex.split(settings.slurm_job_directives or "")],
        # the statistical profiler walks hundreds of prompt threads' stacks (hermes.run.local_processes)
        "job_script_prologue": ["export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False"],
        "death_timeout": DEATH_TIMEOUT, "log_directory": str(log_dir), "scheduler_options": scheduler,
    }


def jobs() -> list[Job]:
    """This user's Slurm jobs named hermes-*; none where Slurm is not installed or does not answer."""
    if not shutil.which("squeue"):
        return []
    try:
        out = subprocess.run(["squeue", "--me", "-h", "-o", "%i|%j|%k|%V|%T"], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError) as e:
        log.warning("could not list Slurm jobs: %s", e)
        return []
    found = []
    for line in out.splitlines():
        job_id, name, comment, submitted, state = (line.split("|", 4) + [""] * 4)[:5]
        if not name.startswith(JOB_PREFIX):
            continue
        owner = comment[len(OWNER_PREFIX):] if comment.startswith(OWNER_PREFIX) else None
        found.append(Job(job_id.strip(), name, owner, _epoch(submitted), state.strip()))
    return found


def _epoch(stamp: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(stamp.strip()).timestamp()  # squeue prints local time
    except ValueError:
        return None


def cancel(ids: list[str]) -> int:
    if not ids:
        return 0
    try:
        subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=60, check=True)
    except (subprocess.SubprocessError, OSError) as e:
        log.warning("could not cancel Slurm job(s) %s: %s", " ".join(ids), e)
        return 0
    return len(ids)


def cancel_owned_by(owner: str, name: str) -> int:
    """Cancel the jobs of one run (by name) that one process owns (other runs of the process keep theirs)."""
    return cancel([j.id for j in jobs() if j.owner == owner and j.name == name and j.state not in ENDING])


def wait_gone(owner: str, name: str, timeout: float = GONE_TIMEOUT) -> list[Job]:
    """Wait until the run's jobs have left the queue (a cancelled job stays COMPLETING while Slurm
    ends its processes), so that none is left when the run returns; the jobs still there after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        left = [j for j in jobs() if j.owner == owner and j.name == name]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def sweep_dead() -> int:
    """Cancel the hermes jobs whose owner (a process of this host) is gone; jobs of other hosts'
    runs are theirs to sweep (or end at their walltime)."""
    dead = [j for j in jobs() if j.state not in ENDING and owner_alive(j.owner, j.submitted) is False]
    if dead:
        log.warning("cancelling %d Slurm job(s) of dead runs: %s", len(dead),
                    ", ".join(f"{j.id} ({j.name}, owner {j.owner})" for j in dead))
    return cancel([j.id for j in dead])


class Slurm:
    elsewhere = True

    @contextlib.contextmanager
    def started(self, settings: RunSettings, run_dir: Path) -> Iterator[RunSettings]:
        import dask.config
        from dask_jobqueue import SLURMCluster

        sweep_dead()
        log_dir = run_dir / "slurm"  # the worker jobs' stdout/stderr, beside the run's outputs
        log_dir.mkdir(parents=True, exist_ok=True)
        with dask.config.set({"distributed.scheduler.unknown-task-duration": BATCH_DURATION_GUESS}):
            cluster = SLURMCluster(**cluster_kwargs(settings, log_dir))
        me, name = owner_label(), job_name(settings.run_name)
        guard = RunGuard(settings.run_name, lambda _run: cancel_owned_by(me, name), what="Slurm jobs")
        try:
            cluster.adapt(minimum_jobs=0, maximum_jobs=settings.slurm_max_jobs)
            guard.install()  # SIGINT/SIGTERM (a Prefect cancellation) cancel the jobs first
            log.info("run '%s': batches on Slurm jobs '%s' (at most %d, %d cores, %s, %s each), scheduler %s",
                     settings.run_name, job_name(settings.run_name), settings.slurm_max_jobs,
                     settings.slurm_cores, settings.slurm_memory, settings.slurm_walltime, cluster.scheduler_address)
            yield settings.model_copy(update={"dask_address": cluster.scheduler_address})
        finally:
            guard.uninstall()
            try:
                cluster.close(timeout=60)
            finally:
                if left := cancel_owned_by(me, name):  # a job submitted as the cluster closed, or a failed scancel
                    log.warning("run '%s': cancelled %d Slurm job(s) left after its cluster closed",
                                settings.run_name, left)
                if still := wait_gone(me, name):
                    log.warning("run '%s': Slurm job(s) %s still in the queue %.0f s after being cancelled",
                                settings.run_name, ", ".join(f"{j.id} ({j.state})" for j in still), GONE_TIMEOUT)

    def sweep(self) -> int:
        return sweep_dead()
