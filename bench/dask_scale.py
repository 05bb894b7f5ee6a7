"""Throughput against Dask workers: one run of a latency-bound workload, no containers, through
the real batch-run flow and Prefect's Dask task runner on a distributed.LocalCluster of 1, 2 and
4 worker processes; the same prompts per worker, so the ideal is linear.

    python -m bench.dask_scale [--per-worker 64] [--num-workers 8] [--latency 1.0] [--repeats 2] [--batch-size 8]

Each prompt is one model call of `latency` seconds (the bundled model server, in its own
process) offered the terminal and file tools it does not call, with the local sandbox backend:
no container, so what is measured is the framework's spread over workers, not Docker. Writes
bench/dask_results.json; bench/DASK_REPORT.md reads from it by hand.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _warm() -> None:
    """What a long-lived worker has imported before any run: not counted as the run's CPU."""
    import hermes.run.remote  # noqa: F401
    import prefect.task_engine  # noqa: F401
    import tasks.run  # noqa: F401


def _lines(run_dir: Path) -> int:
    n = 0
    for p in run_dir.glob("batch_*.jsonl"):
        with open(p, "rb") as f:
            n += f.read().count(b"\n")
    return n


def one_run(workers: int, per_worker: int, num_workers: int, latency: float, base_url: str, scratch: Path,
            tag: str, batch_size: int = 8) -> dict:
    import distributed

    from flows.batch import batch_run
    from hermes.sandbox.base import SandboxSettings
    from hermes.settings import RunSettings
    from tests.helpers import script, write_dataset

    n = workers * per_worker
    run_name = f"dask-w{workers}-{tag}"
    dataset = write_dataset(scratch / f"{run_name}.jsonl", [
        {"prompt": f"{run_name} {i} " + script({"reasoning": "think", "content": f"answer {i}"})} for i in range(n)])
    run_dir = scratch / "data" / run_name
    with distributed.LocalCluster(n_workers=workers, threads_per_worker=2, processes=True, dashboard_address=None,
                                  worker_dashboard_address=None) as cluster, \
            distributed.Client(cluster.scheduler_address) as client:
        client.run(_warm)
        cpu_before = client.run(_cpu_seconds)
        settings = RunSettings(dataset_file=str(dataset), run_name=run_name, output_dir=str(scratch / "data"),
                               base_url=base_url, model="mock-model", batch_size=batch_size, num_workers=num_workers,
                               distribution="terminal_only", sandbox=SandboxSettings(backend="local"),
                               dask_address=cluster.scheduler_address)
        seen: dict[str, float] = {}
        stop = threading.Event()

        def watch() -> None:  # when the first and the last prompt's line landed
            while not stop.is_set():
                lines = _lines(run_dir) if run_dir.exists() else 0
                if lines and "first" not in seen:
                    seen["first"] = time.monotonic()
                if lines >= n:
                    seen["last"] = time.monotonic()
                    return
                stop.wait(0.05)

        load = os.getloadavg()
        watcher = threading.Thread(target=watch, daemon=True)
        flow_cpu, start = _cpu_seconds(), time.monotonic()
        watcher.start()
        stats = batch_run(settings=settings)
        wall = time.monotonic() - start
        flow_cpu = _cpu_seconds() - flow_cpu
        stop.set()
        watcher.join()
        cpu_after = client.run(_cpu_seconds)
    worker_cpu = sum(cpu_after[a] - cpu_before.get(a, 0.0) for a in cpu_after)
    # From the first model call (about one latency before the first line landed) to the last line.
    steady = n / (seen["last"] - seen["first"] + latency) if "last" in seen else None
    return {"workers": workers, "prompts": n, "batch_size": batch_size, "num_workers": num_workers, "wall_s": round(wall, 2),
            "prompts_per_s": round(n / wall, 2), "steady_prompts_per_s": steady and round(steady, 2),
            "ideal_steady_prompts_per_s": None, "worker_cpu_s_per_prompt": round(worker_cpu / n, 4),
            "flow_cpu_s_per_prompt": round(flow_cpu / n, 4), "written": stats["trajectories_written"],
            "failed": stats["prompts_failed"], "load_before": [round(x, 2) for x in load]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dask_scale")
    p.add_argument("--per-worker", type=int, default=64, help="prompts per Dask worker")
    p.add_argument("--num-workers", type=int, default=8, help="--num_workers: prompts in flight per Dask worker")
    p.add_argument("--latency", type=float, default=1.0, help="seconds of each model call")
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", default=str(ROOT / "bench" / "dask_results.json"))
    a = p.parse_args(argv)
    from flows.prefect_env import configure_prefect

    configure_prefect()
    from prefect.testing.utilities import prefect_test_harness

    from tests.helpers import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mockllm", "--port", str(port), "--latency", str(a.latency)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp, prefect_test_harness(server_startup_timeout=180):
            for rep in range(a.repeats):
                for w in [int(x) for x in a.workers.split(",")]:
                    r = one_run(w, a.per_worker, a.num_workers, a.latency, f"http://127.0.0.1:{port}/v1", Path(tmp),
                                str(rep), a.batch_size)
                    r["ideal_steady_prompts_per_s"] = round(w * a.num_workers / a.latency, 2)
                    r["repeat"] = rep
                    print(json.dumps(r), flush=True)
                    results.append(r)
    finally:
        server.terminate()
        server.wait()
    meta = {"cores": os.cpu_count(), "latency_s": a.latency, "per_worker": a.per_worker, "batch_size": a.batch_size,
            "num_workers": a.num_workers, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "note": "shared 2-core machine: other helpers' tests ran at the same time (load_before per run)"}
    Path(a.out).write_text(json.dumps({"meta": meta, "runs": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
