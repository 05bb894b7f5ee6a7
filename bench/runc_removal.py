"""How long removing a runc sandbox takes: by hand (hermes/sandbox/runc/state.py remove_box: the
cgroup's processes killed, the cgroup, runc's state and the folder removed) against `runc delete
--force`, on sandboxes opened the backend's way, each with a background process of its own.

    python -m bench.runc_removal --count 30

Alternates the two ways, one sandbox at a time; prints one JSON object (medians in ms, and the CPU
of this process and its children per removal).
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import time


def _cpu() -> float:
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.runc_removal")
    p.add_argument("--count", type=int, default=30)
    a = p.parse_args(argv)
    from hermes.sandbox.base import SandboxSettings, SandboxSpec
    from hermes.sandbox.runc import state
    from hermes.sandbox.runc.limits import seccomp_or_none
    from hermes.sandbox.runc.sandbox import RuncSandbox

    settings = SandboxSettings(backend="runc")
    seccomp = seccomp_or_none(settings)

    def by_runc_delete(name: str) -> None:
        state.runc("delete", "--force", name)
        shutil.rmtree(state.BOXES / name, ignore_errors=True)

    ways = {"by_hand": state.remove_box, "runc_delete": by_runc_delete}
    wall: dict[str, list[float]] = {w: [] for w in ways}
    cpu: dict[str, float] = {w: 0.0 for w in ways}
    for i in range(a.count):
        for way, remove in ways.items():
            box = RuncSandbox(SandboxSpec(image=settings.image, run_id="bench-removal", prompt_id=f"{way}{i}"),
                              settings, seccomp)
            box.exec("sleep 300 >/dev/null 2>&1 & echo started", timeout=10)
            box._closed = True  # the removal below is the whole of what is timed
            box._link.close()
            c, t = _cpu(), time.perf_counter()
            remove(box.name)
            wall[way].append(time.perf_counter() - t)
            cpu[way] += _cpu() - c
            if state.cgroup_dirs(box.name) or (state.RUNC_ROOT / box.name).exists():
                raise SystemExit(f"{way} left {box.name} behind")
            for f in (box._init.stdin, box._init.stdout, box._init.stderr):
                f.close()
            if box._reaper is not None:
                box._reaper.kill()
    print(json.dumps({way: {"median_ms": round(1000 * statistics.median(wall[way]), 1),
                            "cpu_ms": round(1000 * cpu[way] / a.count, 1)} for way in ways} | {"count": a.count}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
