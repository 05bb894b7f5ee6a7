"""How long a dead owner's sandbox lives (issue 34), on the real engine.

    python -m bench.dead_owner [--lifetime 5] [--margin 5]

1. By itself: a process opens a docker sandbox with SandboxSpec(lifetime=L), base.LIFETIME_MARGIN
   set to M in that process, and is SIGKILLed; nobody runs after it. Measured: seconds from the
   kill until the engine has removed the container (its `sleep L+M` ended; AutoRemove).
2. With a next process: the same, then another process's SandboxBackend.sweep_dead() (what
   any run's start, a worker's start or batch, and a Dask run's end call). Measured: seconds
   from the kill until that sweep has removed it.
Each sandbox runs under a host name of its own (a UTS namespace), so no other run sweeps it.
"""
from __future__ import annotations

import argparse
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "hermes-sandbox-mini:latest"


def _in_own_host(code: str, host: str) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, sys.executable, "-c", code],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def orphan(run: str, host: str, lifetime: float, margin: float) -> tuple[str, float]:
    """(container id, monotonic time of the owner's kill)."""
    code = ("import os, signal\nimport hermes.sandbox.base as base\nfrom hermes.sandbox import open_sandbox\n"
            "from hermes.sandbox.base import SandboxSettings, SandboxSpec\n"
            f"base.LIFETIME_MARGIN = {margin}\n"
            f"sb = open_sandbox(SandboxSpec(image={IMAGE!r}, run_id={run!r}, prompt_id='0', lifetime={lifetime}), SandboxSettings())\n"
            "print(sb.container_id, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    done = _in_own_host(code, host)
    killed = time.monotonic()
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done.stdout.split()[-1], killed


def gone_after(client: docker.DockerClient, cid: str, since: float, limit: float = 600) -> float:
    while time.monotonic() - since < limit:
        if not client.api.containers(all=True, filters={"id": cid}):
            return time.monotonic() - since
        time.sleep(0.05)
    raise SystemExit(f"{cid[:12]} still there after {limit:g} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lifetime", type=float, default=5.0)
    ap.add_argument("--margin", type=float, default=5.0)
    a = ap.parse_args()
    client = docker.from_env()
    host = f"hermes-bench-{secrets.token_hex(3)}"
    cid, killed = orphan(f"bench-orphan-{secrets.token_hex(3)}", host, a.lifetime, a.margin)
    alone = gone_after(client, cid, killed)
    print(f"by itself: lifetime {a.lifetime:g} s + margin {a.margin:g} s; removed by the engine "
          f"{alone:.2f} s after its owner's SIGKILL")
    cid, killed = orphan(f"bench-orphan-{secrets.token_hex(3)}", host, 3600, 60)
    sweep = _in_own_host("from hermes.sandbox import get_backend\nprint(get_backend().sweep_dead())", host)
    swept = gone_after(client, cid, killed)
    print(f"next process's sweep: lifetime 3600 s + margin 60 s; removed {swept:.2f} s after its owner's "
          f"SIGKILL (sweep_dead removed {sweep.stdout.strip()})")


if __name__ == "__main__":
    main()
