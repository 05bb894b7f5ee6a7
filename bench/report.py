"""bench/results.json -> bench/REPORT.md.

    python -m bench.report [results.json] [REPORT.md]      # re-render without re-running
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from bench.analysis import ANALYSIS, METHOD_NOTES
from bench.common import BENCH, median
from bench.runlogs import ours_phases, prompt_stats
from pathlib import Path  # noqa: F811


def _f(x: Any, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float):
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.{digits}f}"
    return str(x)


def _med(runs: list[dict], key: str) -> float:
    return median([r.get(key) for r in runs if r.get(key) is not None])


def _ratio(a: float, b: float) -> float:
    try:
        return a / b if b else float("nan")
    except TypeError:
        return float("nan")


def _others(run: dict) -> float | None:
    """Average busy cores not used by the system under test, the mock or the engine (others' load)."""
    if not run.get("wall") or run.get("machine_busy") is None or run.get("cpu") is None:
        return None
    return max(0.0, (run["machine_busy"] - run["cpu"] - run.get("mock_cpu", 0) - run.get("engine_cpu", 0)) / run["wall"])


VARIANTS = (("ours", "ours (default: Prefect flow, local background server)"),
            ("ours-server", "ours, standing Prefect server"),
            ("ours-direct", "ours, --engine direct (no Prefect)"))


def _metrics(runs: list[dict]) -> dict[str, float]:
    return {k: _med(runs, k) for k in ("prompts_per_s", "steady_prompts_per_s", "cpu_per_prompt", "peak_pss_mib", "ttfc")}


def present_variants(res: dict) -> list[tuple[str, str]]:
    """The variants of ours that any agent workload of these results ran."""
    ws = [w for w in res["workloads"].values() if isinstance(w, dict) and "spec" in w]
    return [(v, label) for v, label in VARIANTS if any(w.get(v) for w in ws)] or [VARIANTS[0]]


def agent_summary(num: int, w: dict, variants: list[tuple[str, str]]) -> tuple[list[list[str]], dict[str, Any]]:
    """Summary rows for workloads 1-4, and the verdict facts."""
    spec, lim = w["spec"], w["limit"]
    ref = _metrics(w["reference"])
    ours = {v: _metrics(w.get(v) or []) for v, _ in VARIANTS}
    ran = [v for v, _ in variants if w.get(v)]
    limit = median([x["per_second"] for x in lim]) if lim else None
    name = f"{num}. {spec['title']}"
    ref_note = " (shares containers between prompts)" if spec["docker"] else ""

    def row(label: str, key: str, digits: int = 2, inverse: bool = False, extra: str = "",
            no_ratio: bool = False) -> list[str]:
        r = ref[key]
        cells = [_f(ours[v][key], digits) if v in ran else "–" for v, _ in variants]
        if no_ratio:
            return ["", label, _f(r, digits), *cells, "", extra]
        word = "× less" if inverse else "×"
        ratios = []
        for v, _ in variants:
            x = (_ratio(r, ours[v][key]) if inverse else _ratio(ours[v][key], r)) if v in ran else float("nan")
            ratios.append("–" if math.isnan(x) else _f(x) + word)
        return ["", label, _f(r, digits), *cells, " / ".join(ratios), extra]

    rows = [row("prompts/s, end to end", "prompts_per_s", extra=_f(limit) if limit else "–"),
            row("prompts/s, first to last model call", "steady_prompts_per_s"),
            row("CPU s per prompt", "cpu_per_prompt", 3, inverse=True),
            row("peak memory (PSS of process tree), MiB", "peak_pss_mib", 0, inverse=True),
            row("time to first model call, s", "ttfc", no_ratio=True)]
    rows[0][0] = name
    rows[0][2] += ref_note
    facts: dict[str, Any] = dict(ref=ref, ours=ours["ours"], srv=ours["ours-server"], direct=ours["ours-direct"],
                                 has_srv="ours-server" in ran, has_direct="ours-direct" in ran, limit=limit, spec=spec)
    verdicts: list[tuple[str, bool, str]] = []
    for v, label in VARIANTS:
        m = ours[v]
        if v not in ran:
            continue
        tag = "" if v == "ours" else f" ({label})"
        op, oc, os_ = m["prompts_per_s"], m["cpu_per_prompt"], m["steady_prompts_per_s"]
        if num == 1:
            x = _ratio(op, ref["prompts_per_s"])
            xs = _ratio(os_, ref["steady_prompts_per_s"])
            verdicts.append((f"prompts/s ≥ 20× the reference's{tag}", x >= 20,
                             f"{_f(x)}× end to end ({_f(x / 20 * 100, 0)}% of the bar); first to last model call {_f(xs)}×"))
            y = _ratio(ref["cpu_per_prompt"], oc)
            verdicts.append((f"CPU per prompt ≤ 1/20 of the reference's{tag}", y >= 20,
                             f"1/{_f(y)} ({_f(oc, 3)} vs {_f(ref['cpu_per_prompt'], 3)} s; the bar is "
                             f"{_f(ref['cpu_per_prompt'] / 20, 3)} s)"))
        elif num == 2:
            x = _ratio(op, limit)
            verdicts.append((f"prompts/s ≥ 85% of the machine's sandbox limit{tag}", x >= 0.85,  # issue 21's bar
                             f"{_f(x * 100, 0)}% of {_f(limit)} sandboxes/s end to end; "
                             f"first to last model call {_f(_ratio(os_, limit) * 100, 0)}%"))
        else:
            per = spec["workers"] / (spec["turns"] * spec["latency"])
            ideal = min(per, limit) if (num == 3 and limit) else per
            facts["ideal"] = ideal
            x = _ratio(op, ideal)
            what = (f"min({spec['workers']}/({spec['turns']}×{_f(spec['latency'], 1)} s), limit {_f(limit)})"
                    if num == 3 else f"{spec['workers']}/({spec['turns']}×{_f(spec['latency'], 1)} s)")
            verdicts.append((f"prompts/s ≥ 90% of ideal = {what} = {_f(ideal)}{tag}", x >= 0.9,
                             f"{_f(x * 100, 0)}% end to end; first to last model call {_f(_ratio(os_, ideal) * 100, 0)}%"))
    facts["verdicts"] = verdicts
    return rows, facts


def _speed_word(ours_over_ref: float) -> str:
    """Time ratio ours/reference as the reader wants it: 'N× faster' or 'N× slower'."""
    if math.isnan(ours_over_ref) or not ours_over_ref:
        return "–"
    return f"{_f(1 / ours_over_ref)}× faster" if ours_over_ref < 1 else f"{_f(ours_over_ref)}× slower"


def data_summary(d: dict) -> tuple[list[list[str]], dict[str, Any]]:
    mo, mr = d["merge"]["ours"], d["merge"].get("reference") or []
    o_mbs, r_mbs = _med(mo, "mb_per_s"), _med(mr, "mb_per_s")
    o_mem, r_mem = _med(mo, "maxrss_mib"), _med(mr, "maxrss_mib")
    small_o = d["merge_small"].get("ours", {}).get("maxrss_mib")
    small_r = (d["merge_small"].get("reference") or {}).get("maxrss_mib")
    n = d["n"]
    rows = [
        [f"5. Merge of {n:,} trajectories ({d['gen']['merge']['bytes'] / 1e6:,.0f} MB)", "MB/s", _f(r_mbs) + " (copy only, see notes)",
         _f(o_mbs), "", _f(_ratio(o_mbs, r_mbs)) + "×", ""],
        ["", f"peak memory (max RSS), MiB (at {n // 10:,} → {n:,})", f"{_f(small_r, 0)} → {_f(r_mem, 0)}",
         f"{_f(small_o, 0)} → {_f(o_mem, 0)}", "", "", ""],
    ]
    growth = _ratio(o_mem, small_o)
    verdicts = [("merge ≥ 100 MB/s", o_mbs >= 100, f"{_f(o_mbs, 0)} MB/s"),
                ("merge memory does not grow with the number of trajectories", growth < 1.25,
                 f"peak {_f(small_o, 0)} MiB at {n // 10:,} → {_f(o_mem, 0)} MiB at {n:,} ({_f(growth)}×)")]
    for case, label in (("all_done", "all done"), ("99pct_done", "99% done")):
        p = d["plan"].get(case)
        if not p:
            continue
        rows.append([f"5. Resume planning, {d['rows']:,} rows, {label}", "seconds (ours: warm index / cold rebuild)",
                     _f(_med(p["reference"], "plan_total")),
                     f"{_f(_med(p['ours_warm'], 'plan_total'))} / {_f(_med(p['ours_cold'], 'plan_total'))}", "",
                     _speed_word(_ratio(_med(p["ours_warm"], "plan_total"), _med(p["reference"], "plan_total"))) + " (warm)", ""])
        rows.append(["", "peak memory (max RSS), MiB", _f(_med(p["reference"], "maxrss_mib"), 0),
                     f"{_f(_med(p['ours_warm'], 'maxrss_mib'), 0)} / {_f(_med(p['ours_cold'], 'maxrss_mib'), 0)}", "", "", ""])
    return rows, {"verdicts": verdicts, "our_mbs": o_mbs, "growth": growth}


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _fill_phases(res: dict) -> None:
    """Older results lack our runs' phases: rebuild them from the kept logs when present."""
    for w in res["workloads"].values():
        for run in [r for v, _ in VARIANTS for r in (w.get(v) or [])] if isinstance(w, dict) and "spec" in w else []:
            if run.get("phases") or run.get("reconstructed") or not Path(run["log"]).exists():
                continue
            ended = run.get("ended") or Path(run["log"]).stat().st_mtime
            started = run.get("started") or ended - run["wall"]
            first = started + run["ttfc"] if run.get("ttfc") is not None else None
            last = first + run["steady"] if first and run.get("steady") else None
            run["phases"] = ours_phases(Path(run["log"]), started, ended, {"first": first, "last": last})
    for w in res["workloads"].values():
        for run in [r for v, _ in VARIANTS for r in (w.get(v) or [])] if isinstance(w, dict) and "spec" in w else []:
            if run.get("prompt_stats"):
                continue
            d = Path(run["log"]).parent / "data"
            dirs = [p for p in d.iterdir() if p.is_dir()] if d.is_dir() else []
            if dirs:
                run["prompt_stats"] = prompt_stats(dirs[0])


def render(res: dict) -> str:
    try:
        _fill_phases(res)
    except Exception:  # noqa: BLE001 - diagnostics only; never lose a report over them
        pass
    meta = res["meta"]
    out: list[str] = []
    out.append("# hermes-batch benchmarks: against hermes-agent 0.19.0 and the machine's limits\n")
    out.append(f"Generated by `{meta['command']}` on {meta['date']} ({meta['mode']}). "
               f"Total time {meta['elapsed_min']:.0f} min. Rerun everything with `python -m bench` "
               "(`python -m bench --quick` for a small smoke check; `python -m bench --help` for sizes and repeats).\n")
    src = res.get("source") or {}
    if src:
        out.append(f"Ours measured at commit `{src.get('commit', '')[:10]}` ({src.get('subject', '')})"
                   + (", from a `git archive` snapshot of HEAD taken at the start (work-tree edits made during the "
                      "run do not leak into it)" if src.get("mode") == "head" else ", from the live work tree")
                   + (f"; product files modified but uncommitted at the start, not measured: {', '.join(src['dirty_at_start'])}"
                      if src.get("dirty_at_start") and src.get("mode") == "head" else "") + ". "
                   f"Reference: {meta.get('reference', 'hermes-agent==0.19.0')} from PyPI.\n")
    m = meta["machine"]
    out.append("## Machine\n")
    out.append(f"{m['cpus']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, kernel {m['kernel']}, Python {m['python']}, "
               f"Docker engine {m['docker_engine']}. Load average at start {m['loadavg_at_start']}. "
               + ("**The machine was shared with other developers' test suites during the run**: "
                  if max(meta["other_load"].values() or [0]) >= 0.2 else "The machine was quiet at each workload's start: ")
               + f"busy cores not ours just before each workload: {', '.join(f'w{k}: {_f(v, 2)}' for k, v in meta['other_load'].items())}; "
               "every comparison below is between runs made minutes apart in the same invocation, "
               "interleaved (reference, then each variant of ours, then again), so all saw similar load. "
               "Numbers of different invocations are not comparable to each other.\n")
    out.append("## What was run\n")
    out.append(_table(["workload", "sizes run", "issue's sizes", "repeats"], meta["sizes"]) + "\n")
    if meta.get("reduced"):
        out.append(f"**Reduced sizes**: {meta['reduced']}\n")
    for note in meta.get("notes") or []:
        out.append(f"**Note**: {note}\n")

    # ---------------------------------------------------------------- summary
    out.append("## Summary (medians over repeats)\n")
    rows: list[list[str]] = []
    variants = present_variants(res)
    verdicts: list[tuple[str, str, bool, str]] = []
    facts: dict[str, Any] = {}
    for key in ("1", "2", "3", "4"):
        w = res["workloads"].get(key)
        if not w:
            continue
        r, f = agent_summary(int(key), w, variants)
        rows += r
        facts[key] = f
        verdicts += [(key, *v) for v in f["verdicts"]]
    if res["workloads"].get("5"):
        r, f = data_summary(res["workloads"]["5"])
        rows += [r_[:4] + [""] * (len(variants) - 1) + r_[5:] for r_ in r]
        facts["5"] = f
        verdicts += [("5", *v) for v in f["verdicts"]]
    out.append(_table(["workload", "metric", "reference", *[label for _, label in variants],
                       "ours vs reference (in column order)",
                       "machine limit (sandboxes/s)"], rows) + "\n")
    out.append("### Targets\n")
    out.append(_table(["workload", "target", "result", "measured"],
                      [[k, t, "**met**" if ok else "**missed**", txt] for k, t, ok, txt in verdicts]) + "\n")

    if res.get("warmup"):
        out.append("### The first invocation after set-up\n")
        out.append("Each system's first run of this invocation (4 prompts, 2 workers, 3 calls at zero latency, no "
                   "containers), before any workload: for ours on the default path it is the run that starts the "
                   "local background Prefect server (and creates its database), which every later run of ours reuses.\n")
        out.append(_table(["system", "wall s", "first model call s", "CPU s", "rc"],
                          [[dict(VARIANTS).get(r["system"], r["system"]), _f(r.get("wall"), 1), _f(r.get("ttfc")),
                            _f(r.get("cpu")), str(r.get("rc"))] for r in res["warmup"]]) + "\n")

    if res["workloads"].get("6"):
        from bench.ratelimited import section
        out.append(section(res["workloads"]["6"]))

    # ---------------------------------------------------------------- analysis
    out.append("## Where a target is missed: why, and what would close it\n")
    for key in ("1", "2", "3", "4", "5"):
        if key not in facts:
            continue
        missed = [v for v in verdicts if v[0] == key and not v[2]]
        text = ANALYSIS.get(key)
        if text:
            out.append(f"### Workload {key}{' — missed' if missed else ' — met'}\n")
            try:
                out.append(text(facts[key], missed, res) if callable(text) else text)
            except Exception as e:  # noqa: BLE001 - a gap in the figures must not lose the report
                out.append(f"(analysis unavailable: {type(e).__name__}: {e})")
            out.append("")

    # ---------------------------------------------------------------- details
    out.append("## Details per run\n")
    for key in ("1", "2", "3", "4"):
        w = res["workloads"].get(key)
        if not w:
            continue
        s = w["spec"]
        out.append(f"### Workload {key}: {s['title']}\n")
        out.append(f"{s['n']} prompts, `--num_workers {s['workers']}`, {s['turns']} model calls per prompt at "
                   f"{s['latency']} s each, {'Docker' if s['docker'] else 'no containers'}. "
                   f"Busy cores of others just before: {_f(w.get('other_load_before'))}.\n")
        hdr = ["run", "system", "rc", "wall s", "prompts/s", "steady prompts/s", "CPU s/prompt", "peak PSS MiB",
               "peak RSS MiB", "procs", "first call s", "engine CPU s", "mock CPU s", "others' cores", "requests", "written"]
        rr = []
        allruns = w["reference"] + [r for v, _ in VARIANTS for r in (w.get(v) or [])]
        for i, run in enumerate(sorted(allruns, key=lambda x: int(Path(x["log"]).parent.name.rsplit("-", 1)[1]))):
            rr.append([str(i), run["system"], str(run["rc"]), _f(run["wall"], 1), _f(run["prompts_per_s"]),
                       _f(run["steady_prompts_per_s"]), _f(run["cpu_per_prompt"], 3), _f(run["peak_pss_mib"], 0),
                       _f(run["peak_rss_mib"], 0), _f(run["peak_procs"]), _f(run["ttfc"]), _f(run["engine_cpu"], 1),
                       _f(run["mock_cpu"], 1), _f(_others(run)), _f(run["chat_requests"]), _f(run["written"])])
        out.append(_table(hdr, rr) + "\n")
        ph_rows = []
        for v, label in VARIANTS:
            runs = [r for r in (w.get(v) or []) if r.get("phases")]
            if runs:
                keys = ["launch_to_server_starting", "server_start", "launch_to_flow_begins", "flow_begins_to_first_call",
                        "launch_to_first_call", "first_to_last_call", "last_call_to_flow_finished",
                        "flow_finished_to_exit", "last_call_to_exit"]
                ph_rows.append([label] + [_f(median([r["phases"].get(k) for r in runs if r["phases"].get(k) is not None]))
                                          for k in keys] + [_f(_med(runs, "wall"), 1)])
        if ph_rows:
            out.append("Where our wall time went (medians, seconds; from Prefect's log timestamps and the model server's):\n")
            out.append(_table(["variant", "launch → a server starting (ephemeral, or the first background one)",
                               "server start", "launch → flow run begins (a running server)",
                               "flow begins → first model call", "launch → first model call", "first → last model call",
                               "last call → flow finished (merge, report)", "flow finished → exit",
                               "last call → exit", "wall"], ph_rows) + "\n")
        ps_rows = []
        for v, label in VARIANTS:
            runs = [r for r in (w.get(v) or []) if r.get("prompt_stats")]
            if runs and s["docker"]:
                ks = ["elapsed_median", "elapsed_p90", "sandbox_wait_median", "sandbox_wait_p90"]
                ps_rows.append([label] + [_f(median([r["prompt_stats"].get(k) for r in runs
                                                     if r["prompt_stats"].get(k) is not None])) for k in ks]
                               + [_f(s["workers"] / _med(runs, "steady_prompts_per_s"))
                                  if _med(runs, "steady_prompts_per_s") else "–"])
        if ps_rows:
            out.append("Per prompt, from our journal (medians over runs; seconds): a prompt's time from start to entry "
                       "(its container's removal included), and how long its first tool call waited for the container "
                       f"(prefetched with the prompt). Model time per prompt: {s['turns']} × {s['latency']} s. Last column: "
                       "seconds a worker slot is held per prompt in steady state (workers ÷ steady rate).\n")
            out.append(_table(["variant", "elapsed median", "elapsed p90", "sandbox wait median", "sandbox wait p90",
                               "slot held per prompt"], ps_rows) + "\n")
        if w["limit"]:
            out.append("Machine's sandbox limit in the same run (bare docker SDK loop: create, start, one exec, remove; "
                       f"concurrency {s['workers']}): " + ", ".join(
                           f"{_f(x['per_second'])}/s ({x['done']} sandboxes, median life {_f(x['median_life'])} s, "
                           f"{x['errors']} errors)" for x in w["limit"]) + "\n")
        ex = {r["system"]: r for r in allruns if r.get("command")}
        if ex:
            out.append("Commands (one example each; the model server is `python -m bench.mockserver --port 0 "
                       f"--latency {s['latency']} --turns {s['turns']}`):\n")
        else:
            out.append("Commands: as in workload 2, with `--num_workers 64`, `--batch_size 6` and the model server "
                       f"at `--latency {s['latency']} --turns {s['turns']}`.\n")
        for sysname, r in ex.items():
            if r.get("command"):
                out.append(f"- {sysname}: `{r['command']}`")
        if any(r.get("other_paths") for r in w["reference"]):
            out.append("- other requests the reference made to the model server in one run (path: count; the mock "
                       f"answers each 404 at once): {w['reference'][0].get('other_paths')}")
        out.append("")
    d = res["workloads"].get("5")
    if d:
        out.append("### Workload 5: data scale\n")
        g = d["gen"]
        out.append(f"Merge input: {g['merge']['entries']:,} journal lines in {g['merge']['files']:,} batch files, "
                   f"{g['merge']['bytes'] / 1e6:,.0f} MB (made by `python -m bench.datascale gen-merge`).\n")
        rr = []
        for who in ("reference", "ours"):
            for i, x in enumerate(d["merge"].get(who) or []):
                rr.append([f"{who} {i}", _f(x["seconds"]), _f(x["mb_per_s"], 0), _f(x["peak_pss_mib"], 0),
                           _f(x["maxrss_mib"], 0), str(x["written"])])
        for who in ("reference", "ours"):
            x = d["merge_small"].get(who)
            if x:
                rr.append([f"{who} at {d['n'] // 10:,}", _f(x["seconds"]), _f(x["mb_per_s"], 0),
                           _f(x["peak_pss_mib"], 0), _f(x["maxrss_mib"], 0), str(x["written"])])
        out.append(_table(["run", "seconds", "MB/s", "peak PSS MiB", "max RSS MiB", "trajectories written"], rr) + "\n")
        for case, p in d["plan"].items():
            gg = g.get(case, {})
            out.append(f"Resume planning, {case.replace('_', ' ')}: dataset {gg.get('rows', 0):,} rows "
                       f"({gg.get('dataset_bytes', 0) / 1e6:,.0f} MB), journal {gg.get('done', 0):,} lines "
                       f"({gg.get('journal_bytes', 0) / 1e6:,.0f} MB).\n")
            rr = []
            for who in ("reference", "ours_cold", "ours_warm"):
                for i, x in enumerate(p.get(who) or []):
                    rr.append([f"{who} {i}", _f(x.get("load_rows")), _f(x.get("open_index", x.get("scan_journal"))),
                               _f(x.get("done_keys")), _f(x.get("difference")), _f(x.get("plan_total")),
                               _f(x.get("checkpoint")), _f(x.get("peak_pss_mib"), 0), str(x.get("owed"))])
            out.append(_table(["run", "load dataset s", "index (ours) / scan journal (ref) s", "done_keys s",
                               "difference s", "plan total s", "+checkpoint.json s", "peak PSS MiB", "owed"], rr) + "\n")
    out.append("## Method notes\n")
    out.append(METHOD_NOTES)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    src = Path(argv[0]) if argv else BENCH / "results.json"
    dst = Path(argv[1]) if len(argv) > 1 else BENCH / "REPORT.md"
    dst.write_text(render(json.loads(src.read_text())))
    print(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
