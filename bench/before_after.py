"""Two commits of ours side by side on the bench's workloads, in one invocation.

    python -m bench.before_after --before 171bafd --after HEAD --workloads 1,2 --pairs 3

Each commit is measured from a `git archive` of its product files (bench.run.product_source),
with its own Prefect home (so its own background server for the default path), on the bench's
own workload specs (bench.run.workload_specs: workload 1 without containers, 2 with one per
prompt). Runs alternate before, after, after, before... for each variant (the default path and
`--engine direct`), so the machine's other load and the place in a pair fall on both alike. Prints one JSON line per
run and a markdown table with each pair's after/before ratios of prompts/s and CPU per prompt;
`--output` writes the table and the raw runs to a file as well.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import log
from bench.run import FULL, Systems, ensure_images, product_source, remove_our_bench_containers, workload_specs

VARIANTS = {"default": "ours", "direct": "ours-direct"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, metavar="COMMIT")
    p.add_argument("--after", default="HEAD", metavar="COMMIT")
    p.add_argument("--workloads", default="1,2")
    p.add_argument("--variants", default="default,direct", help="comma list of: default, direct")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--prompts", type=int, default=None, help="prompts per run (default: the bench's own, 200)")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--output", default=None, help="also write the table and the runs (JSON) to this file")
    a = p.parse_args(argv)
    spec_args = argparse.Namespace(**FULL)
    if a.prompts:
        spec_args.w1_prompts = spec_args.w2_prompts = a.prompts
    specs = workload_specs(spec_args)
    wanted = [int(w) for w in a.workloads.split(",") if w.strip()]
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    scratch = Path(tempfile.mkdtemp(prefix="hermes-before-after-"))
    systems: dict[str, Systems] = {}
    sources: dict[str, dict] = {}
    for label, ref in (("before", a.before), ("after", a.after)):
        sources[label] = product_source(scratch / label, "head", ref)
        systems[label] = Systems(scratch / label, None, None, Path(sources[label]["path"]))
        log(f"{label}: {sources[label]['commit'][:10]} {sources[label]['subject'][:80]}")
    if any(specs[w]["docker"] for w in wanted):
        ensure_images()
    rows: list[dict[str, Any]] = []
    try:
        for label in systems:  # warm-up: each commit's background Prefect server starts here, not in a measured run
            for v in variants:
                systems[label].run(VARIANTS[v], n=4, workers=2, latency=0.0, turns=3, docker=False,
                                   tag="warmup", timeout=600)
        for w in wanted:
            spec = specs[w]
            for v in variants:
                for pair in range(a.pairs):
                    # A B, then B A: the run in the second place of a pair is slower (on workload 2
                    # by about 10%, the engine still busy with the first run's containers), whichever it is
                    for label in (list(systems) if pair % 2 == 0 else list(systems)[::-1]):
                        r = systems[label].run(VARIANTS[v], n=spec["n"], workers=spec["workers"],
                                               latency=spec["latency"], turns=spec["turns"], docker=spec["docker"],
                                               tag=f"w{w}{label[0]}{pair}", timeout=a.timeout)
                        row = {"workload": w, "variant": v, "pair": pair + 1, "commit": label, "rc": r["rc"],
                               "written": r["written"], "wall": round(r["wall"], 2),
                               "prompts_per_s": round(r["prompts_per_s"], 3),
                               "cpu_per_prompt": round(r["cpu_per_prompt"], 4),
                               "machine_busy": r.get("machine_busy")}
                        print(json.dumps(row), flush=True)
                        rows.append(row)
    finally:
        from flows.local_server import stop as stop_background_server
        for s in systems.values():
            stop_background_server(s.prefect_home)
        remove_our_bench_containers()
        shutil.rmtree(scratch, ignore_errors=True)
    text = table(rows, sources)
    print(text)
    if a.output:
        Path(a.output).write_text(text + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


def table(rows: list[dict[str, Any]], sources: dict[str, dict]) -> str:
    out = [f"before: `{sources['before']['commit'][:10]}` {sources['before']['subject']}",
           f"after: `{sources['after']['commit'][:10]}` {sources['after']['subject']}", "",
           "| workload | variant | pair | before prompts/s | after prompts/s | after/before | "
           "before CPU s/prompt | after CPU s/prompt | after/before |",
           "|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[tuple, list[float]] = {}
    for (w, v, pair) in sorted({(r["workload"], r["variant"], r["pair"]) for r in rows}):
        b = next(r for r in rows if (r["workload"], r["variant"], r["pair"], r["commit"]) == (w, v, pair, "before"))
        af = next((r for r in rows if (r["workload"], r["variant"], r["pair"], r["commit"]) == (w, v, pair, "after")), None)
        if af is None:
            continue
        speed, cpu = af["prompts_per_s"] / b["prompts_per_s"], af["cpu_per_prompt"] / b["cpu_per_prompt"]
        ratios.setdefault((w, v), []).append(speed)
        out.append(f"| {w} | {v} | {pair} | {b['prompts_per_s']:.2f} | {af['prompts_per_s']:.2f} | {speed:.2f}× | "
                   f"{b['cpu_per_prompt']:.4f} | {af['cpu_per_prompt']:.4f} | {cpu:.2f}× |")
    out += ["", "Median after/before prompts/s: " + ", ".join(
        f"workload {w} {v} {statistics.median(r):.2f}×" for (w, v), r in sorted(ratios.items()))]
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
