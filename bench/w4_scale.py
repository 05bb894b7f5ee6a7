"""Workload 4 at scale: ours against the model server's own limit, alternated, in one invocation.

    python -m bench.w4_scale --prompts 2048 --workers 512 --latency 1 --pairs 3

Issue 21's workload 4: 2048 prompts, 512 in flight, 3 calls of 1 s each, no containers
(`terminal_only` in local sandboxes); ideal = prompts / (3 × latency × prompts / workers).
Each pair runs, each against a fresh bundled model server: the endpoint floor
(bench/endpoint_floor.py, a minimal asyncio client: what the server can give at this
concurrency on this machine), the same client doing the tool calls for real (its files and
`/bin/sh` commands: what a minimal client gets when the workload's work is done too), ours with
`--engine direct`, and ours as a user runs it by default (a Prefect flow on the local
background server, started by a warm-up run first).
Prompts/s is over the server's first to last chat request, as in bench/run.py. Prints one
JSON line per run and a markdown table; `--output` writes them to a file too.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import REPO, MockServer, log
from bench.run import Systems, product_source


def floor(n: int, workers: int, latency: float, where: Path, tools: bool = False) -> dict[str, Any]:
    mock = MockServer(latency=latency, turns=3, log_path=where / "floor-mock.log")
    url = mock.start()
    try:
        out = subprocess.run([sys.executable, "-m", "bench.endpoint_floor", "--url", url, "--prompts", str(n),
                              "--concurrency", str(workers)] + (["--tools"] if tools else []),
                             cwd=REPO, capture_output=True, text=True,
                             timeout=3600, env={**os.environ, "PYTHONPATH": str(REPO)})
        mock_cpu = mock.cpu()
    finally:
        mock.stop()
    if out.returncode != 0:
        raise RuntimeError(f"endpoint floor failed: {out.stderr[-2000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["mock_cpu"] = mock_cpu
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=2048)
    p.add_argument("--workers", type=int, default=512)
    p.add_argument("--latency", type=float, default=1.0)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--ref", default="HEAD", help="the commit of ours to measure")
    p.add_argument("--baseline", default=None,
                   help="also ours at this commit with --engine direct (and the default path unless --no-default), "
                        "alternated with --ref's in every pair")
    p.add_argument("--no-default", action="store_true", help="leave out the default (Prefect) path")
    p.add_argument("--processes", action="store_true",
                   help="also ours with --engine direct over two worker processes (--worker_processes 2)")
    p.add_argument("--no-floor-tools", action="store_true",
                   help="leave out the minimal client that runs the tool calls for real (endpoint_floor --tools)")
    p.add_argument("--output", default=None)
    a = p.parse_args(argv)
    n, workers, latency = a.prompts, a.workers, a.latency
    ideal = n / (3 * latency * n / workers)
    scratch = Path(tempfile.mkdtemp(prefix="hermes-w4-"))
    src = product_source(scratch, "head", a.ref)
    systems = Systems(scratch, None, None, Path(src["path"]))
    log(f"ours at {src['commit'][:10]}; ideal {ideal:.1f} prompts/s")
    variants = ["ours-direct"] + (["ours-direct-2p"] if a.processes else []) + ([] if a.no_default else ["ours"])
    runs = [(v, v, systems) for v in variants]  # (row label, variant, whose code)
    if a.baseline:
        base_src = product_source(scratch / "baseline", "head", a.baseline)
        base = Systems(scratch / "baseline", None, None, Path(base_src["path"]))
        base.prefect_home = systems.prefect_home  # one background server for both
        log(f"baseline at {base_src['commit'][:10]}")
        runs = [r for v in variants for r in ((v, v, systems), (f"baseline {v}", v, base))]
    rows: list[dict[str, Any]] = []
    try:
        for _, v, who in runs:
            who.run(v, n=4, workers=2, latency=0.0, turns=3, docker=False, tag="warmup", timeout=600)
        for pair in range(a.pairs):
            for label, tools in [("endpoint floor", False)] + ([] if a.no_floor_tools else
                                                                 [("minimal client, tools run", True)]):
                f = floor(n, workers, latency, scratch, tools)
                rows.append({"pair": pair + 1, "system": label, "pps": f["steady_prompts_per_s"],
                             "mean_call_s": f["mean_call_s"], "cpu": None, "rss": None, "written": n, "rc": 0})
                print(json.dumps(rows[-1]), flush=True)
            for label, v, who in runs:
                r = who.run(v, n=n, workers=workers, latency=latency, turns=3, docker=False,
                            tag=f"w4p{pair}", timeout=3600)
                rows.append({"pair": pair + 1, "system": label, "pps": r["steady_prompts_per_s"], "mean_call_s": None,
                             "cpu": r["cpu"], "rss": r["peak_pss_mib"], "written": r["written"], "rc": r["rc"],
                             "elapsed_median": r["prompt_stats"].get("elapsed_median")})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        from flows.local_server import stop as stop_background_server
        stop_background_server(systems.prefect_home)
        shutil.rmtree(scratch, ignore_errors=True)
    lines = [f"ours at `{src['commit'][:10]}` {src['subject']}",
             f"{n} prompts, {workers} in flight, 3 calls × {latency} s; ideal {ideal:.1f} prompts/s", "",
             "| pair | system | prompts/s | % of ideal | % of the endpoint floor | CPU s | CPU ms/prompt | "
             "peak PSS MiB (process tree) | MiB per prompt in flight | written |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fl = next(x["pps"] for x in rows if x["pair"] == r["pair"] and x["system"] == "endpoint floor")
        cpu = "" if r["cpu"] is None else f"{r['cpu']:.1f} | {1000 * r['cpu'] / n:.1f}"
        rss = "" if r["rss"] is None else f"{r['rss']:.0f} | {r['rss'] / workers:.2f}"
        lines.append(f"| {r['pair']} | {r['system']} | {r['pps']:.1f} | {100 * r['pps'] / ideal:.0f}% | "
                     f"{100 * r['pps'] / fl:.0f}% | {cpu or ' | '} | {rss or ' | '} | {r['written']} |")
    text = "\n".join(lines)
    print(text)
    if a.output:
        Path(a.output).write_text(text + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")
    return 0 if all(r["rc"] == 0 and r["written"] == n for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
