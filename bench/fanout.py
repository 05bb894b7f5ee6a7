"""Batches as Prefect task runs (mapped) against batches as coroutines in the flow (in-process
fan-out): two commits of ours side by side in one invocation, with the reference on workload 1.

    python -m bench.fanout --before d1f8632 --after HEAD --pairs 2 --output /tmp/fanout.json

Cases (each on the default path: a Prefect flow on the commit's own local background server):

- w1:      200 prompts, 4 workers, 3 calls, 0 s latency, local sandboxes (batches of 50); the
           reference (hermes-agent 0.19.0, bench.run.ensure_reference) runs it in each pair too
- w2:      the same with a Docker container per prompt
- latency: 640 prompts, 64 workers, 3 calls x 1 s, batches of 10 (64 batches)
- tiny:    2048 prompts, 64 workers, 3 calls, 0 s, batches of 4 (512 batches): the CPU per batch

Each commit comes from a `git archive` (bench.run.product_source) with its own PREFECT_HOME. Runs
alternate (before, after; then after, before; the reference first in odd pairs, last in even ones).
Beside each run: the 1-minute load average at its start and end, the CPU of the run's process tree
(the flow's process and what it started) and the CPU of the commit's background Prefect server
(its pid from PREFECT_HOME/hermes-server.json, its process tree through psutil) from the run's
start to a settle time after its exit, less the server's idle rate measured between runs.
Writes the raw runs as JSON lines as they finish (`--output`) and prints the tables at the end.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import log
from bench.run import Systems, ensure_images, ensure_reference, product_source, remove_our_bench_containers

CASES: dict[str, dict[str, Any]] = {
    "w1": dict(n=200, workers=4, latency=0.0, turns=3, docker=False, batch_size=None),
    "w2": dict(n=200, workers=4, latency=0.0, turns=3, docker=True, batch_size=None),
    "latency": dict(n=640, workers=64, latency=1.0, turns=3, docker=False, batch_size=10),
    "tiny": dict(n=2048, workers=64, latency=0.0, turns=3, docker=False, batch_size=4),
}
SETTLE_S = 3.0  # the server records a run's last task-run states and logs after the client exits


class SystemsWithEnv(Systems):
    """Systems whose runs of ours get extra environment variables (a diagnostic: --env-for)."""

    def __init__(self, *args: Any, extra_env: dict[str, str] | None = None, **kw: Any):
        super().__init__(*args, **kw)
        self.extra_env = extra_env or {}

    def command(self, system: str, **kw: Any) -> tuple[list[str], dict[str, str], Path]:
        cmd, env, out = super().command(system, **kw)
        return cmd, {**env, **self.extra_env} if system != "reference" else env, out


def server_tree_cpu(prefect_home: Path) -> float | None:
    """CPU seconds so far of the background Prefect server recorded in PREFECT_HOME."""
    try:
        pid = json.loads((prefect_home / "hermes-server.json").read_text())["pid"]
        root = psutil.Process(pid)
        total = 0.0
        for p in [root] + root.children(recursive=True):
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total
    except (OSError, KeyError, ValueError, psutil.Error):
        return None


def idle_rate(prefect_home: Path, seconds: float = 6.0) -> float:
    """The server's CPU seconds per second with no run: its loop services' own polling."""
    c0 = server_tree_cpu(prefect_home)
    time.sleep(seconds)
    c1 = server_tree_cpu(prefect_home)
    return (c1 - c0) / seconds if c0 is not None and c1 is not None else 0.0


def one_run(systems: dict[str, Systems], label: str, case: str, spec: dict[str, Any], tag: str,
            idle: dict[str, float], timeout: float) -> dict[str, Any]:
    s = systems[label]
    system = "reference" if label == "reference" else "ours"
    load0 = os.getloadavg()[0]
    srv0 = None if system == "reference" else server_tree_cpu(s.prefect_home)
    r = s.run(system, n=spec["n"], workers=spec["workers"], latency=spec["latency"], turns=spec["turns"],
              docker=spec["docker"], tag=tag, timeout=timeout, batch_size=spec["batch_size"])
    load1 = os.getloadavg()[0]
    batches = math.ceil(spec["n"] / r["batch_size"])
    row = {"case": case, "commit": label, "rc": r["rc"], "written": r["written"], "n": spec["n"],
           "workers": spec["workers"], "batch_size": r["batch_size"], "batches": batches,
           "wall": round(r["wall"], 2), "prompts_per_s": round(r["prompts_per_s"], 3),
           "flow_cpu": round(r["cpu"], 2), "cpu_per_prompt": round(r["cpu_per_prompt"], 4),
           "machine_busy_cores": round(r["machine_busy"] / r["wall"], 2) if r["wall"] else None,
           "load_start": round(load0, 2), "load_end": round(load1, 2)}
    if srv0 is not None:
        time.sleep(SETTLE_S)
        srv1 = server_tree_cpu(s.prefect_home)
        raw = (srv1 - srv0) if srv1 is not None else None
        row["server_cpu_raw"] = round(raw, 2) if raw is not None else None
        row["server_cpu"] = round(raw - idle[label] * (r["wall"] + SETTLE_S), 2) if raw is not None else None
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", metavar="COMMIT", help="required unless --render")
    p.add_argument("--after", default="HEAD", metavar="COMMIT")
    p.add_argument("--cases", default="w1,w2,latency,tiny", help="comma list of: " + ", ".join(CASES))
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--no-reference", action="store_true", help="skip the reference on w1")
    for case, key, kind in (("latency", "n", int), ("latency", "workers", int), ("latency", "latency", float),
                            ("latency", "batch_size", int), ("tiny", "n", int), ("tiny", "workers", int),
                            ("tiny", "batch_size", int)):
        p.add_argument(f"--{case}-{key.replace('_', '-')}", type=kind, default=None, dest=f"{case}_{key}",
                       help=f"default {CASES[case][key]}")
    p.add_argument("--env-for", action="append", default=[], metavar="SIDE:KEY=VALUE",
                   help="an environment variable for one side's runs, e.g. after:PREFECT_LOGGING_TO_API_ENABLED=false")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--output", default=None, help="append each run's JSON line to this file as it ends")
    p.add_argument("--render", default=None, metavar="FILE", help="print the tables of an --output file and exit")
    a = p.parse_args(argv)
    if a.render:
        print(tables([json.loads(line) for line in Path(a.render).read_text().splitlines() if line.strip()]))
        return 0
    if not a.before:
        p.error("--before is required")
    for case, spec in CASES.items():
        for key in spec:
            if getattr(a, f"{case}_{key}", None) is not None:
                spec[key] = getattr(a, f"{case}_{key}")
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    scratch = Path(tempfile.mkdtemp(prefix="hermes-fanout-"))
    systems: dict[str, Systems] = {}
    sources: dict[str, dict] = {}
    for label, ref in (("before", a.before), ("after", a.after)):
        sources[label] = product_source(scratch / label, "head", ref)
        extra = dict(e.split(":", 1)[1].split("=", 1) for e in a.env_for if e.split(":", 1)[0] == label)
        systems[label] = SystemsWithEnv(scratch / label, None, None, Path(sources[label]["path"]), extra_env=extra)
        log(f"{label}: {sources[label]['commit'][:10]} {sources[label]['subject'][:80]}" + (f" env {extra}" if extra else ""))
    if "w1" in cases and not a.no_reference:
        try:
            systems["reference"] = Systems(scratch / "reference", ensure_reference())
        except Exception as e:  # noqa: BLE001 - the report then uses the last recorded reference figure
            log(f"the reference could not be installed: {type(e).__name__}: {e}")
    if any(CASES[c]["docker"] for c in cases):
        ensure_images()
    out = open(a.output, "a") if a.output else None
    rows: list[dict[str, Any]] = []
    idle: dict[str, float] = {}
    try:
        for label, s in systems.items():  # warm-up: servers start, the reference installs its speech package
            s.run("reference" if label == "reference" else "ours", n=4, workers=2, latency=0.0, turns=3,
                  docker=False, tag="warmup", timeout=900)
        for label in ("before", "after"):
            idle[label] = idle_rate(systems[label].prefect_home)
            log(f"{label}: idle server {idle[label] * 1000:.1f} ms CPU/s")
        for case in cases:
            spec = CASES[case]
            for pair in range(a.pairs):
                order = ["before", "after"] if pair % 2 == 0 else ["after", "before"]
                if case == "w1" and "reference" in systems:
                    order = ["reference", *order] if pair % 2 == 0 else [*order, "reference"]
                for label in order:
                    row = one_run(systems, label, case, spec, f"{case}{label[0]}{pair}", idle, a.timeout)
                    row["pair"] = pair + 1
                    row["sources"] = sources[label]["commit"][:10] if label in sources else "hermes-agent==0.19.0"
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    if out:
                        out.write(json.dumps(row) + "\n")
                        out.flush()
    finally:
        from flows.local_server import stop as stop_background_server
        for label in ("before", "after"):
            stop_background_server(systems[label].prefect_home)
        remove_our_bench_containers()
        if out:
            out.close()
        shutil.rmtree(scratch, ignore_errors=True)
    print(tables(rows, idle))
    return 0 if all(r["rc"] == 0 and r["written"] == r["n"] for r in rows) else 1


def tables(rows: list[dict[str, Any]], idle: dict[str, float] | None = None) -> str:
    """Per pair: prompts/s of each side and after/before; the CPU per batch of flow and server."""
    out = ["| case | pair | before prompts/s | after prompts/s | after/before | reference prompts/s | "
           "after/reference | load (1 min) at starts |", "|---|---|---|---|---|---|---|---|"]
    ratios: dict[str, list[float]] = {}
    pairs = sorted({(r["case"], r["pair"]) for r in rows}, key=lambda k: (list(CASES).index(k[0]), k[1]))
    get = {(r["case"], r["pair"], r["commit"]): r for r in rows}
    for case, pair in pairs:
        b, af, ref = (get.get((case, pair, c)) for c in ("before", "after", "reference"))
        if not (b and af):
            continue
        ratios.setdefault(case, []).append(af["prompts_per_s"] / b["prompts_per_s"])
        vs_ref = f"{af['prompts_per_s'] / ref['prompts_per_s']:.1f}×" if ref else "–"
        if ref:
            ratios.setdefault("w1 vs reference", []).append(af["prompts_per_s"] / ref["prompts_per_s"])
        loads = " / ".join(f"{x['commit'][0]} {x['load_start']:.1f}" for x in (b, af, ref) if x)
        out.append(f"| {case} | {pair} | {b['prompts_per_s']:.2f} | {af['prompts_per_s']:.2f} | "
                   f"{af['prompts_per_s'] / b['prompts_per_s']:.3f} | {ref['prompts_per_s']:.2f} | {vs_ref} | {loads} |"
                   if ref else
                   f"| {case} | {pair} | {b['prompts_per_s']:.2f} | {af['prompts_per_s']:.2f} | "
                   f"{af['prompts_per_s'] / b['prompts_per_s']:.3f} | – | – | {loads} |")
    out += ["", "Medians: " + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in ratios.items()), "",
            "| case | pair | commit | batches | wall s | flow CPU s | flow CPU ms/batch | server CPU s (net of idle) | "
            "server CPU ms/batch | load start-end |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in rows if r["commit"] != "reference"),
                    key=lambda r: (list(CASES).index(r["case"]), r["pair"], r["commit"] != "before")):
        srv = r.get("server_cpu")
        out.append(f"| {r['case']} | {r['pair']} | {r['commit']} | {r['batches']} | {r['wall']:.1f} | {r['flow_cpu']:.1f} | "
                   f"{1000 * r['flow_cpu'] / r['batches']:.1f} | {srv if srv is not None else '–'} | "
                   f"{(1000 * srv / r['batches']) if srv is not None else float('nan'):.1f} | "
                   f"{r['load_start']:.1f}-{r['load_end']:.1f} |")
    if idle:
        out += ["", "Idle server CPU (subtracted): " + ", ".join(f"{k} {v * 1000:.1f} ms/s" for k, v in idle.items())]
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
