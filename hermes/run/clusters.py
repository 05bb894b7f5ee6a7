"""Where a run's batches run (--cluster): a registry of clusters, none of whose callers asks a name.

A cluster is a context around the run: as it opens it may start Dask workers somewhere (Slurm
jobs) and hands the run its settings with their scheduler's `dask_address`, so that from there on
the run is the Dask path (hermes.run.remote: one flow run, one DuckDB owner, batches rerun when a
worker dies); as it closes its workers go. `sweep()` removes what runs that died without closing
left (jobs), for the next run's start and `hermes-batch sandbox cleanup`.

    local   nothing started: this process's threads, --worker_processes, or the cluster at --dask_address
    slurm   Dask workers as Slurm jobs through dask-jobqueue (hermes.run.slurm)
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import ContextManager, Iterator, Protocol

from hermes.run.rundir import RunRefused
from hermes.settings import RunSettings


class Cluster(Protocol):
    #: True when the run's prompts always run in processes this cluster starts (never this one's)
    elsewhere: bool

    def started(self, settings: RunSettings, run_dir: Path) -> ContextManager[RunSettings]:
        """The run's settings while its workers are up (dask_address set where it starts some)."""
        ...

    def sweep(self) -> int:
        """Remove what dead runs left (of every run); how many things went."""
        ...


class Local:
    elsewhere = False

    @contextlib.contextmanager
    def started(self, settings: RunSettings, run_dir: Path) -> Iterator[RunSettings]:
        yield settings

    def sweep(self) -> int:
        return 0


CLUSTERS: dict[str, Cluster] = {}


def register(name: str, cluster: Cluster) -> None:
    CLUSTERS[name] = cluster


def of(settings: RunSettings) -> Cluster:
    """The run's cluster; an unknown name or one mixed with --dask_address is refused, naming the field."""
    cluster = CLUSTERS.get(settings.cluster)
    if cluster is None:
        raise RunRefused(f"cluster: unknown cluster '{settings.cluster}'; choose one of: {', '.join(CLUSTERS)}")
    if cluster.elsewhere and settings.dask_address:
        raise RunRefused(f"cluster: '{settings.cluster}' starts its own Dask workers and cannot be combined with "
                         f"dask_address {settings.dask_address} (from --dask_address or $HERMES_DASK_ADDRESS)")
    return cluster


def sweep_all() -> dict[str, int]:
    """What dead runs left, removed from every cluster this machine can reach: name -> how many."""
    return {name: cluster.sweep() for name, cluster in CLUSTERS.items()}


def _register_builtins() -> None:
    from hermes.run.slurm import Slurm  # its dask-jobqueue is imported only when a run uses it

    register("local", Local())
    register("slurm", Slurm())


_register_builtins()
