"""Workload 2 on the runc backend beside the docker backend, in one invocation, with both
machine limits (bench/sandbox_limit.py: the engine's loop and the bare runc loop).

    python -m bench.runc_w2 --prompts 200 --repeats 1 [--backends docker,runc] [--no-limits]

Workload 2 as bench/run.py runs it (200 prompts, 4 workers, 3 model calls, no latency, terminal
draws, the bench image), ours in its default path (Prefect flow), docker then runc, alternated
per repeat, after a warm-up run that starts the Prefect background server they share; the two
machine limits measured between them. Prints one JSON object: per run its end-to-end rate
(prompts over the command's wall time) and its steady rate (prompts over the time from the
first model call to the last, which leaves out Prefect's start and the merge).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.run import BENCH_IMAGE, Systems, ensure_images, log


class BackendSystems(Systems):
    backend = "docker"

    def command(self, system, **kw):
        cmd, env, out = super().command(system, **kw)
        cmd[cmd.index("--sandbox_backend") + 1] = self.backend
        return cmd, env, out


def limit(backend: str, concurrency: int, count: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.sandbox_limit", "--backend", backend, "--concurrency",
                          str(concurrency), "--count", str(count), "--image", BENCH_IMAGE],
                         capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.runc_w2")
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--backends", default="docker,runc")
    p.add_argument("--no-limits", action="store_true", help="skip the machine-limit loops")
    a = p.parse_args(argv)
    ensure_images()
    backends = a.backends.split(",")
    results: dict = {k: [] for b in backends for k in (b, f"limit_{b}")}
    with tempfile.TemporaryDirectory(prefix="hbench-runc-") as scratch:
        systems = BackendSystems(Path(scratch), None)
        try:
            measure(systems, a, backends, results)
        finally:
            # Its home goes with the scratch folder: left running, it would cost every later
            # benchmark about 1% of a core, polling a database nobody reads.
            from flows.local_server import stop as stop_background_server
            stop_background_server(systems.prefect_home)
    print(json.dumps(results))
    return 0


def measure(systems: BackendSystems, a: argparse.Namespace, backends: list[str], results: dict) -> None:
    # The warm-up starts the Prefect background server every later run reuses: without it the
    # first backend measured (docker) paid the server's start in its wall time.
    systems.backend = backends[0]
    systems.run("ours", n=8, workers=a.workers, latency=0.0, turns=3, docker=True, tag="w2warmup", timeout=600)
    for i in range(a.repeats):
        for backend in backends:
            systems.backend = backend
            res = systems.run("ours", n=a.prompts, workers=a.workers, latency=0.0, turns=3, docker=True,
                              tag=f"w2{backend}{i}", timeout=1800)
            results[backend].append({k: res[k] for k in ("rc", "wall", "prompts_per_s", "steady_prompts_per_s",
                                                          "ttfc", "machine_busy", "cpu_per_prompt", "peak_pss_mib",
                                                          "peak_procs", "written", "prompts_failed")})
            if not a.no_limits:
                results[f"limit_{backend}"].append(limit(backend, a.workers, 100))
                log(f"  {backend} machine limit: {results[f'limit_{backend}'][-1]['per_second']:.2f} sandboxes/s")


if __name__ == "__main__":
    sys.exit(main())
