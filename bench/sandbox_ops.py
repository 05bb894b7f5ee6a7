"""A prompt's sandbox work, old path against new, side by side in one run.

    python -m bench.sandbox_ops [--sequences 40] [--concurrency 4] [--rounds 4] [--image hermes-sandbox-mini:latest]

One sequence is what a prompt of workload 2 asks of its sandbox: create+start, write_file,
a terminal command, read_file, close. Variants:

* old: an exec per call (the channel disabled), close waits for the engine's remove
* new: the command channel, close hands the removal to the background removers
* bare: the machine's unit (docker SDK: create, start, one exec, remove), for scale

Each variant runs `sequences` sequences at `concurrency`, split into `rounds` interleaved rounds
so that other load on the machine hits all variants alike. Reported: the median time a sequence
holds its slot, sequences per second (the new path's counted until its removals are done), and
the ratios. Compare ratios, not absolute times: the machine is shared and noisy.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from hermes.sandbox import SandboxSettings, SandboxSpec, get_backend
from hermes.sandbox.docker.engine import get_client

backend = get_backend(SandboxSettings())  # the docker backend: the default settings'

RUN = f"bench-ops-{uuid.uuid4().hex[:6]}"


def prompt_like(image: str, channel: bool) -> float:
    started = time.monotonic()
    sb = backend.open(SandboxSpec(image=image, run_id=RUN, prompt_id="ops"))
    if not channel:
        sb._link.usable = False  # every call gets an exec of its own, as before the channel
    sb.write_file("notes/todo.txt", b"token 42\n")
    sb.exec("cat notes/todo.txt; hostname")
    sb.read_file("notes/todo.txt")
    sb.close(wait=not channel)
    return time.monotonic() - started


def bare(image: str) -> float:
    started = time.monotonic()
    api = get_client().api
    c = api.create_container(image, command=["sleep", "600"], labels={"hermes-batch.run": RUN},
                             host_config=api.create_host_config(network_mode="none"))
    api.start(c["Id"])
    ex = api.exec_create(c["Id"], ["true"])
    api.exec_start(ex["Id"])
    api.remove_container(c["Id"], force=True)
    return time.monotonic() - started


def round_of(fn, n: int, concurrency: int) -> tuple[list[float], float]:
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        held = list(pool.map(lambda _: fn(), range(n)))
    backend.drain(300)  # throughput counts the removals, wherever they ran
    return held, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sequences", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--image", default="hermes-sandbox-mini:latest")
    a = ap.parse_args(argv)
    variants = {"old": lambda: prompt_like(a.image, False), "new": lambda: prompt_like(a.image, True),
                "bare": lambda: bare(a.image)}
    for fn in variants.values():  # warm up: images, clients, first-use checks
        fn()
    held: dict[str, list[float]] = {k: [] for k in variants}
    wall: dict[str, float] = {k: 0.0 for k in variants}
    per_round = max(1, a.sequences // a.rounds)
    try:
        for _ in range(a.rounds):
            for name, fn in variants.items():
                times, took = round_of(fn, per_round, a.concurrency)
                held[name] += times
                wall[name] += took
    finally:
        backend.cleanup(RUN, include_live=True)
    med = {k: statistics.median(v) for k, v in held.items()}
    rate = {k: len(held[k]) / wall[k] for k in variants}
    print(f"{len(held['old'])} sequences per variant, concurrency {a.concurrency}, {a.rounds} interleaved rounds")
    for k in variants:
        print(f"  {k:5s} median slot held {med[k] * 1000:7.1f} ms   {rate[k]:5.2f} sequences/s (removals included)")
    print(f"slot held, new / old:  {med['new'] / med['old']:.2f}")
    print(f"slot held, new / bare: {med['new'] / med['bare']:.2f}   old / bare: {med['old'] / med['bare']:.2f}")
    print(f"throughput, new / old: {rate['new'] / rate['old']:.2f}   new / bare: {rate['new'] / rate['bare']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
