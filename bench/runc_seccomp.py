"""What a runc sandbox's seccomp filter costs: a bare `runc run` of `sh -c hostname` under the
runc backend's spec (hermes/sandbox/runc/spec.py), with the engine's profile for all its ABIs
(x86_64, i386, x32 on this machine), for the native ABI only (the backend's choice), and with no
filter at all.

    python -m bench.runc_seccomp --count 40 --repeats 2

Alternates the three, `count` sandboxes each, one at a time; prints one JSON object per round
(milliseconds a sandbox: wall, and the CPU of runc and its children).
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time


def _children_cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime, r.ru_stime


def one_round(seccomp: dict | None, count: int, image: str) -> dict:
    from hermes.sandbox.base import SandboxSettings
    from hermes.sandbox.runc import state
    from hermes.sandbox.runc.rootfs import image_root
    from hermes.sandbox.runc.spec import build_spec

    settings = SandboxSettings(backend="runc", image=image)
    root = image_root(image, settings)
    (u0, s0), t0 = _children_cpu(), time.monotonic()
    for n in range(count):
        name = f"hermes-bench-seccomp-{n}-{time.monotonic_ns()}"
        box = state.STATE / "bench" / name
        box.mkdir(parents=True)
        try:
            spec = build_spec(root, settings, "/workspace", ["sh", "-c", "hostname"], hostname=name[-12:],
                              cgroup=state.cgroup_path(name), seccomp=seccomp)
            (box / "config.json").write_text(json.dumps(spec))
            out = state.runc("run", "--bundle", str(box), name, timeout=60)
            if out.returncode != 0:
                raise RuntimeError(f"runc run failed: {out.stderr.decode(errors='replace')[-300:]}")
        finally:
            shutil.rmtree(box, ignore_errors=True)
    (u1, s1), wall = _children_cpu(), time.monotonic() - t0
    return {"wall_ms": 1000 * wall / count, "user_ms": 1000 * (u1 - u0) / count, "sys_ms": 1000 * (s1 - s0) / count}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.runc_seccomp")
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--image", default="hermes-bench-sandbox:latest")
    a = p.parse_args(argv)
    from hermes.sandbox.runc import rootfs

    native = rootfs.docker_seccomp()
    cached = sorted(rootfs.CACHE.glob("seccomp-docker-*.json"))[-1]
    variants = {"engine's ABIs": json.loads(cached.read_text()), "native ABI": native, "no filter": None}
    for i in range(a.repeats):
        row = {"round": i + 1}
        for label, seccomp in variants.items():
            row[label] = {k: round(v, 1) for k, v in one_round(seccomp, a.count, a.image).items()}
            if seccomp is not None:
                row[label]["architectures"] = seccomp.get("architectures")
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
