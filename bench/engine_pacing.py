"""Sandboxes started per second: the pacing controller against fixed engine concurrency (issue #49).

    python -m bench.engine_pacing --backend docker|runc [--sandboxes 200] [--workers 64]
        [--fixed 1,2,4,8,16,64] [--rounds 2] [--ceiling 64] [--image hermes-sandbox-mini:latest]

One sandbox is what a prompt's sandbox costs at the least: open, one command, close (the
removal in the background, as a run does; a configuration's time runs until its removals are
done). `workers` threads ask for sandboxes as fast as they get them (a run with that many
prompts in flight), so the gate, not the callers, bounds what is in flight. Each configuration
is a fixed gate (--sandbox_engine_pacing fixed, --sandbox_engine_concurrency N) or the controller
(adaptive, that ceiling), started fresh each round as a new run would be. Configurations run
interleaved in `rounds` rounds so that other load on this shared machine hits all alike; the
report gives each one's sandboxes a second (the median over rounds), the best fixed setting,
and the controller's ratio to it, with the limits the controller went through.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from hermes.sandbox import SandboxSettings, SandboxSpec, get_backend
from hermes.sandbox.pacing import _pacers

RUN = f"bench-pacing-{uuid.uuid4().hex[:6]}"


def one_config(backend_name: str, image: str, n: int, workers: int, pacing: str, concurrency: int) -> dict:
    settings = SandboxSettings(backend=backend_name, image=image, engine_pacing=pacing,
                               engine_concurrency=concurrency, engine_timeout=120)
    backend = get_backend(settings)
    key = "Docker engine" if backend_name == "docker" else backend_name
    left = [n]
    lock = threading.Lock()
    failures: list[str] = []

    def worker() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            try:
                sb = backend.open(SandboxSpec(image=image, run_id=RUN, prompt_id="pacing"))
                try:
                    sb.exec("true")
                finally:
                    sb.close(wait=False)
            except Exception as e:  # noqa: BLE001 - counted and reported, not hidden
                failures.append(f"{type(e).__name__}: {e}"[:200])

    gate = _pacers.get(key)
    if gate is not None:
        gate.configure(concurrency, pacing == "adaptive")
        gate.reset()
    started = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        for _ in range(workers):
            pool.submit(worker)
    backend.drain(600)
    took = time.monotonic() - started
    gate = _pacers[key]
    ctl = gate.controller
    return {"pacing": pacing, "concurrency": concurrency, "sandboxes": n, "seconds": round(took, 2),
            "rate": round((n - len(failures)) / took, 2), "failures": len(failures), "failure_examples": failures[:3],
            "final_limit": gate.limit, "accepted": ctl.accepted if pacing == "adaptive" else None,
            "limits": [lim for _, lim in ctl.history] if pacing == "adaptive" else None,
            "overloads": ctl.overloads}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["docker", "runc"], default="docker")
    ap.add_argument("--sandboxes", type=int, default=200)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--fixed", default="1,2,4,8,16,64")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ceiling", type=int, default=64)
    ap.add_argument("--image", default="hermes-sandbox-mini:latest")
    ap.add_argument("--json", default=None, help="write the results here too")
    a = ap.parse_args()
    backend = get_backend(SandboxSettings(backend=a.backend, image=a.image))
    backend.ensure_image(a.image)
    configs = [("fixed", int(c)) for c in a.fixed.split(",")] + [("adaptive", a.ceiling)]
    rows: dict[tuple[str, int], list[dict]] = {c: [] for c in configs}
    for r in range(a.rounds):
        for c in configs if r % 2 == 0 else reversed(configs):  # alternate order: drift hits all alike
            res = one_config(a.backend, a.image, a.sandboxes, a.workers, *c)
            rows[c].append(res)
            print(f"round {r + 1} {c[0]:8s} {c[1]:3d}: {res['rate']:6.2f} sandboxes/s "
                  f"({res['seconds']} s, {res['failures']} failed, limit at end {res['final_limit']}"
                  + (f", limits {res['limits'][:24]}" if res["limits"] else "") + ")", flush=True)
    med = {c: statistics.median(x["rate"] for x in rows[c]) for c in configs}
    fixed = {c: v for c, v in med.items() if c[0] == "fixed"}
    best = max(fixed, key=fixed.get)
    adaptive = med[("adaptive", a.ceiling)]
    print(f"\n{a.backend}: {a.sandboxes} sandboxes (open + one command + close), {a.workers} callers, "
          f"median of {a.rounds} rounds")
    print("| setting | sandboxes/s | vs best fixed |\n|---|---|---|")
    for c in configs:
        name = f"fixed {c[1]}" if c[0] == "fixed" else f"adaptive (ceiling {c[1]})"
        print(f"| {name} | {med[c]:.2f} | {med[c] / med[best]:.2f}x |")
    print(f"best fixed: {best[1]} ({med[best]:.2f}/s); adaptive {adaptive:.2f}/s = {adaptive / med[best]:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"backend": a.backend, "args": vars(a), "median": {f"{k[0]} {k[1]}": v for k, v in med.items()},
                       "rounds": {f"{k[0]} {k[1]}": v for k, v in rows.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
