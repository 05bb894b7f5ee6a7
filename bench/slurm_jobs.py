"""What --cluster slurm's worker jobs cost on the one-machine Slurm (deployments/slurm/local_cluster.sh):
seconds from asking for N jobs to N Dask workers registered with the run's scheduler, and from
closing the cluster to no job of it left in squeue (the run's end waits for that).

    python -m bench.slurm_jobs [--jobs 2] [--repeats 3]

Real Slurm, real dask-jobqueue, the run's own job settings (hermes.run.slurm.cluster_kwargs).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from hermes.run import slurm
from hermes.sandbox.lifecycle import owner_label
from hermes.settings import RunSettings


def one(jobs: int, log_dir: Path, run_name: str) -> dict[str, float]:
    import dask.config
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    settings = RunSettings(dataset_file="-", batch_size=1, run_name=run_name, cluster="slurm",
                           slurm_scheduler_host="127.0.0.1", slurm_cores=2, slurm_memory="2GB")
    with dask.config.set({"distributed.scheduler.unknown-task-duration": slurm.BATCH_DURATION_GUESS}):
        cluster = SLURMCluster(**slurm.cluster_kwargs(settings, log_dir))
    started = time.perf_counter()
    cluster.scale(jobs=jobs)
    with Client(cluster) as client:
        client.wait_for_workers(jobs, timeout=300)
    ready = time.perf_counter() - started
    closing = time.perf_counter()
    cluster.close(timeout=60)
    left = slurm.wait_gone(owner_label(), slurm.job_name(run_name), timeout=120)
    gone = time.perf_counter() - closing
    assert not left, left
    return {"workers_ready_s": round(ready, 2), "jobs_gone_s": round(gone, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [one(args.jobs, Path(tmp), f"bench-slurm-{i}") for i in range(args.repeats)]
    for key in ("workers_ready_s", "jobs_gone_s"):
        values = [r[key] for r in rows]
        print(f"{key}: {values} median {statistics.median(values):.2f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
