"""Sandbox lifecycle cost by image and runtime: the Debian default image against the busybox one,
under runc and under gVisor (runsc), beside the machine's ceiling (bench.sandbox_limit).

    python -m bench.sandbox_runtime [--concurrency 4] [--count 24] [--rounds 3] [--out FILE]

One sandbox = what a prompt's sandbox costs: our backend's open (create + start, hardened),
one command over the channel, one file write and read, close (removed, waited for). Each
variant runs `count` sandboxes at `concurrency`, and the variants take turns round by round
(with the ceiling: the bare SDK loop of bench.sandbox_limit on the busybox image), so a load
that comes and goes on a shared machine falls on all of them alike; the medians over rounds
and each variant's ratio to the ceiling of the same rounds are printed as JSON.
Containers carry the run label `bench-rt-*` and are removed however it ends.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from bench import sandbox_limit
from hermes.sandbox import SandboxSettings, SandboxSpec, cleanup, get_backend
from hermes.sandbox.image import DEFAULT_TAG, MINI_TAG, ensure_image_built

RUN = f"bench-rt-{uuid.uuid4().hex[:6]}"
VARIANTS = {"busybox": (MINI_TAG, None), "debian": (DEFAULT_TAG, None),
            "busybox+runsc": (MINI_TAG, "runsc"), "debian+runsc": (DEFAULT_TAG, "runsc")}


def one(image: str, runtime: str | None) -> float:
    backend = get_backend(SandboxSettings(image=image, runtime=runtime))
    started = time.monotonic()
    box = backend.open(SandboxSpec(image=image, run_id=RUN, prompt_id="rt"))
    try:
        box.write_file("notes/todo.txt", b"token 42\n")
        res = box.exec("cat notes/todo.txt; echo $((6 * 7))")
        if res.exit_code != 0 or "42" not in res.output:
            raise RuntimeError(f"command failed: {res}")
        box.read_file("notes/todo.txt")
    finally:
        box.close(wait=True)
    return time.monotonic() - started


def round_of(image: str, runtime: str | None, count: int, concurrency: int) -> dict:
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        lives = list(pool.map(lambda _: one(image, runtime), range(count)))
    wall = time.monotonic() - started
    return {"per_second": count / wall, "median_life": statistics.median(lives)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sandbox_runtime")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--count", type=int, default=24, help="sandboxes per variant per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=None, help="also write the JSON here")
    a = p.parse_args(argv)
    variants = {k: VARIANTS[k] for k in a.variants.split(",")}
    for image, _ in variants.values():
        ensure_image_built(image)
    rounds: dict[str, list[dict]] = {k: [] for k in ["ceiling", *variants]}
    try:
        for _ in range(a.rounds):
            limit = sandbox_limit.run(a.concurrency, a.count, MINI_TAG, hardened=True)
            rounds["ceiling"].append({"per_second": limit["per_second"], "median_life": limit["median_life"]})
            for name, (image, runtime) in variants.items():
                rounds[name].append(round_of(image, runtime, a.count, a.concurrency))
    finally:
        cleanup(RUN, include_live=True)
    ceiling = [r["per_second"] for r in rounds["ceiling"]]
    result = {"concurrency": a.concurrency, "count": a.count, "rounds": a.rounds, "variants": {}}
    for name, rs in rounds.items():
        rates = [r["per_second"] for r in rs]
        result["variants"][name] = {
            "per_second_median": round(statistics.median(rates), 2),
            "per_second_rounds": [round(r, 2) for r in rates],
            "median_life_s": round(statistics.median(r["median_life"] for r in rs), 3),
            "of_ceiling": round(statistics.median(r / c for r, c in zip(rates, ceiling)), 3),
        }
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
