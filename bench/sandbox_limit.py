"""The machine's sandbox limit: a bare loop of the docker SDK at a given concurrency.

    python -m bench.sandbox_limit --concurrency 4 --count 60 --image hermes-bench-sandbox:latest

Each of `concurrency` threads loops: create a container (the same hardening our DockerSandbox
applies: no network, cap-drop ALL, no-new-privileges, non-root user, memory/CPU/pids limits,
read-only root with tmpfs at /tmp and /workspace, an init process), start it, exec once
(`cat /etc/hostname`), remove it (force). Prints one JSON object: sandboxes per second over
the whole loop, and the median life of one sandbox. Containers carry the label `hermes-bench`
and are removed however the loop ends.

    python -m bench.sandbox_limit --backend runc --concurrency 4 --count 200

is the runc backend's machine limit: each thread loops `runc run` (in the foreground: create,
start, wait, delete) of a bundle with the runc backend's own hardening (hermes/sandbox/runc/spec.py:
the same namespaces, limits, seccomp, read-only shared image root, tmpfs work space) whose
process is `sh -c hostname` (the image has no /etc/hostname: the engine mounts that).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import docker

LABEL = "hermes-bench"


def one(client: docker.DockerClient, image: str, hardened: bool) -> float:
    api = client.api
    t0 = time.monotonic()
    if hardened:
        hc = api.create_host_config(
            network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"],
            mem_limit="1g", memswap_limit="1g", nano_cpus=int(1e9), pids_limit=256, read_only=True,
            tmpfs={m: "rw,exec,nosuid,nodev,size=256m,mode=1777" for m in ("/tmp", "/workspace")},
            init=True)
    else:
        hc = api.create_host_config()
    c = api.create_container(image, command=["2147483647"], entrypoint=["sleep"], user="65534:65534",
                             labels={LABEL: "1"}, host_config=hc, detach=True, working_dir="/tmp")
    cid = c["Id"]
    try:
        api.start(cid)
        ex = api.exec_create(cid, ["cat", "/etc/hostname"], stdout=True, stderr=True)
        out = api.exec_start(ex["Id"])
        if not out.strip():
            raise RuntimeError("exec returned nothing")
    finally:
        api.remove_container(cid, force=True, v=True)
    return time.monotonic() - t0


def run(concurrency: int, count: int, image: str, hardened: bool = True) -> dict:
    client = docker.from_env(timeout=120, max_pool_size=max(10, concurrency * 2))
    client.ping()
    lock = threading.Lock()
    todo = [count]
    lives: list[float] = []
    errors: list[str] = []

    def worker() -> None:
        while True:
            with lock:
                if todo[0] <= 0:
                    return
                todo[0] -= 1
            try:
                life = one(client, image, hardened)
                with lock:
                    lives.append(life)
            except Exception as e:  # noqa: BLE001 - count and go on
                with lock:
                    errors.append(f"{type(e).__name__}: {e}"[:200])

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for f in [pool.submit(worker) for _ in range(concurrency)]:
            f.result()
    wall = time.monotonic() - t0
    client.close()
    return {"concurrency": concurrency, "count": count, "done": len(lives), "errors": len(errors),
            "error_sample": errors[:3], "wall": wall, "per_second": len(lives) / wall if wall else 0.0,
            "median_life": statistics.median(lives) if lives else None, "hardened": hardened, "image": image}


def one_runc(image: str, n: int) -> float:
    """One bare runc sandbox: a bundle written, `runc run` to its end (runc deletes it then)."""
    import json
    import shutil

    from hermes.sandbox.base import SandboxSettings
    from hermes.sandbox.runc import state
    from hermes.sandbox.runc.rootfs import docker_seccomp, image_root
    from hermes.sandbox.runc.spec import build_spec

    t0 = time.monotonic()
    s = SandboxSettings(backend="runc", image=image)
    name = f"hermes-bench-{n}-{time.monotonic_ns()}"
    box = state.STATE / "bench" / name
    box.mkdir(parents=True)
    try:
        spec = build_spec(image_root(image, s), s, "/workspace", ["sh", "-c", "hostname"],
                          hostname=name[-12:], cgroup=state.cgroup_path(name), seccomp=docker_seccomp())
        (box / "config.json").write_text(json.dumps(spec))
        out = state.runc("run", "--bundle", str(box), name, timeout=60)
        if out.returncode != 0 or not out.stdout.strip():
            raise RuntimeError(f"runc run failed: {out.stderr.decode(errors='replace')[-300:]}")
    finally:
        shutil.rmtree(box, ignore_errors=True)
    return time.monotonic() - t0


def run_runc(concurrency: int, count: int, image: str) -> dict:
    from hermes.sandbox.base import SandboxSettings
    from hermes.sandbox.runc.rootfs import docker_seccomp, image_root

    image_root(image, SandboxSettings(backend="runc", image=image))  # unpacked before the clock starts
    docker_seccomp()
    lock = threading.Lock()
    todo = [count]
    lives: list[float] = []
    errors: list[str] = []

    def worker() -> None:
        while True:
            with lock:
                if todo[0] <= 0:
                    return
                todo[0] -= 1
                n = todo[0]
            try:
                life = one_runc(image, n)
                with lock:
                    lives.append(life)
            except Exception as e:  # noqa: BLE001 - count and go on
                with lock:
                    errors.append(f"{type(e).__name__}: {e}"[:200])

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for f in [pool.submit(worker) for _ in range(concurrency)]:
            f.result()
    wall = time.monotonic() - t0
    return {"backend": "runc", "concurrency": concurrency, "count": count, "done": len(lives), "errors": len(errors),
            "error_sample": errors[:3], "wall": wall, "per_second": len(lives) / wall if wall else 0.0,
            "median_life": statistics.median(lives) if lives else None, "hardened": True, "image": image}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sandbox_limit")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--count", type=int, default=60)
    p.add_argument("--image", default="hermes-bench-sandbox:latest")
    p.add_argument("--plain", action="store_true", help="no hardening options (the engine's floor)")
    p.add_argument("--backend", choices=("docker", "runc"), default="docker",
                   help="runc: the runc backend's machine limit (runc run directly, no engine)")
    a = p.parse_args(argv)
    if a.backend == "runc":
        print(json.dumps(run_runc(a.concurrency, a.count, a.image)))
        return 0
    try:
        result = run(a.concurrency, a.count, a.image, hardened=not a.plain)
    finally:
        client = docker.from_env()
        for c in client.api.containers(all=True, filters={"label": LABEL}):
            try:
                client.api.remove_container(c["Id"], force=True, v=True)
            except docker.errors.DockerException:
                pass
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
