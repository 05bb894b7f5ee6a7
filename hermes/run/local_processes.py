"""A run's prompts spread over worker processes on this machine (--worker_processes N).

Each prompt in flight is a thread of one interpreter, whose work takes turns on its lock: a run
gets at most about one core's worth of Python out of one process, however many cores the
machine has. With N processes it gets up to N, for runs with many prompts in flight against an
endpoint that answers them all. Off by default: on a two-core machine that also serves the
model, two worker processes were slower than one at 512 prompts in flight (bench/W4_SCALE.md).

The processes are a Dask LocalCluster (distributed): each worker process runs batches as on
any Dask cluster (hermes.run.remote), with `num_workers // N` prompts in flight, so --num_workers
stays the ceiling of the whole run. The run's own process keeps the index, the lock, progress
(from the journal) and the outputs, and once the workers are gone it removes whatever
containers of the run they left (a worker killed mid-prompt). Worker processes read the model
API key from the environment they inherit (the CLI's --api_key is put there) unless the
direct engine hands them the key it was given, and each adapts to the endpoint's rate limits
on its own. Their logs are printed as the run's process prints its own (on the direct engine a
Dask preload, `dask_setup`, gives them its handler's format and level; under Prefect its own
handlers do it in every process).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import logging
from typing import Any, Iterator

from hermes.run.prompt_log import QuietPrompts, quiet_prompts_on
from hermes.settings import RunSettings

log = logging.getLogger(__name__)

#: the worker processes' Dask settings: no statistical profiler, which walks every thread's stack
#: many times a second (hundreds of prompt threads: it cost a fifth of the workers' CPU)
WORKER_CONFIG = {"distributed": {"worker": {"profile": {"enabled": False}}}}


def processes_for(settings: RunSettings) -> int:
    """How many processes on this machine run the run's prompts (1: the run's own, on threads)."""
    if settings.dask_address:
        return 1  # a cluster's workers run them: none here
    return min(settings.worker_processes, settings.num_workers)


def elsewhere(settings: RunSettings) -> bool:
    """Do the run's prompts finish in other processes than the run's own?"""
    return bool(settings.dask_address) or processes_for(settings) > 1


def share(settings: RunSettings) -> int:
    """Prompts in flight in each worker process."""
    return max(1, settings.num_workers // processes_for(settings))


def cluster_kwargs(settings: RunSettings) -> dict[str, Any]:
    """distributed.LocalCluster's arguments for the run (Prefect's DaskTaskRunner takes them too)."""
    return {"n_workers": processes_for(settings), "threads_per_worker": share(settings), "processes": True,
            # no dashboards: nothing listens beyond the cluster's own loopback ports
            "dashboard_address": None, "worker_dashboard_address": None, "host": "127.0.0.1",
            # a worker at its memory limit is restarted by its nanny; its batches rerun (hermes.run.remote)
            "memory_limit": "auto", "config": _worker_config()}


def _worker_config(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    import dask.config

    return dask.config.merge(dask.config.config, WORKER_CONFIG, extra or {})  # a Nanny's config replaces the worker's


def _our_logging() -> dict[str, Any]:
    """How this process prints hermes' logs (the direct engine's handler), for its worker processes
    to print theirs alike. Under Prefect its own handlers do that in every process."""
    logger = logging.getLogger("hermes")
    formatter = next((h.formatter for h in logger.handlers if h.formatter is not None), None)
    if formatter is None:
        return {}
    quiet = any(isinstance(f, QuietPrompts) for h in logger.handlers for f in h.filters)
    return {"hermes": {"log": {"level": logger.getEffectiveLevel(), "format": formatter._fmt,
                               "datefmt": formatter.datefmt, "quiet_prompts": quiet}}}


def dask_setup(worker: Any) -> None:
    """Run in each worker process as it starts (a Dask preload): hermes' logs as the run's process prints them."""
    import dask.config

    how = dask.config.get("hermes.log", None)
    if not how:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(how["format"], how["datefmt"]))
    if how.get("quiet_prompts"):
        quiet_prompts_on([handler])
    logger = logging.getLogger("hermes")
    logger.setLevel(how["level"])
    logger.addHandler(handler)


@contextlib.contextmanager
def cluster(settings: RunSettings) -> Iterator[concurrent.futures.Executor]:
    """An executor whose submit(fn, *args, key=...) runs fn(*args) in one of this machine's worker
    processes (Dask's own concurrent.futures face of a client), for the block's duration: the
    cluster closes with it, and its processes are gone after."""
    from distributed import Client, LocalCluster

    kwargs = cluster_kwargs(settings)
    if logs := _our_logging():
        kwargs.update(config=_worker_config(logs), preload=[__name__])
    log.info("run '%s': prompts in %d worker processes on this machine, %d in flight in each",
             settings.run_name, kwargs["n_workers"], kwargs["threads_per_worker"])
    with LocalCluster(**kwargs) as local, Client(local) as client:
        yield client.get_executor(pure=False)
