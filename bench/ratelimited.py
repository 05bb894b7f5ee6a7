"""Workload 6: an endpoint that enforces a requests-per-minute cap and injects 5xx; one that answers 429 at random.

    python -m bench --workloads 6 [--w6-rpm 600 --w6-prompts 200 --w6-workers 64]

The bundled model server with `--rpm R` (a provider's tier: 429 at once beyond R a minute, one
second's worth at a time, Retry-After and x-ratelimit-* headers) and `--error-rate P
--error-status 500`. Ours as a user runs it by default (a Prefect flow), and with --engine direct.
Targets (issue 21): throughput at least 90% of what R allows, 429s at most 10% of requests,
and every prompt done in ONE invocation.

"What R allows" is R/60 requests a second over the span from the first model request to the
last (the server's burst lets a little more through at the start); a prompt needs `turns`
successful requests, so R allows R / 60 / turns prompts a second.

Noisy 429s (issue 34): the same prompts against the bundled server answering 429 to a seeded
NOISE_SHARE of requests whatever their rate (`--error-rate 0.35 --error-status 429 --retry-after 1`,
no cap, as llmock's `--error-rate 429=0.35` and an aggregator whose upstream throttles), side by
side with the same server answering every request. Target: goodput (prompts done a minute, first
to last request) at least half the clean run's, every prompt done or failed with its reason, one
invocation. Both at NOISE_LATENCY a call: with the prompts in flight fixed (--num_workers) and each
throttled call's retry waiting its Retry-After S, no limiter gets more than (1-p)L / (L+pS) of the
clean goodput (each call takes 1/(1-p) attempts of L and p/(1-p) waits of S), 0.55 here;
that bound is reported beside the ratio.
"""
from __future__ import annotations

from typing import Any

TITLE = "Rate-limited endpoint (requests-a-minute cap, 429 and injected 5xx)"
THROUGHPUT_TARGET, SHARE_429_TARGET = 0.90, 0.10
NOISE_SHARE, NOISE_RETRY_AFTER, NOISE_LATENCY, GOODPUT_TARGET = 0.35, 1.0, 2.0, 0.5


def spec(a: Any) -> dict[str, Any]:
    return dict(title=TITLE, n=a.w6_prompts, workers=a.w6_workers, latency=a.w6_latency, turns=3, docker=False,
                rpm=a.w6_rpm, error_rate=a.w6_error_rate)


def run_workload(s: dict[str, Any], systems: Any, repeats: int, timeout: float, direct_variant: bool) -> dict[str, Any]:
    from bench.common import log, other_load_sample

    log(f"workload 6: {TITLE}: {s['n']} prompts, {s['workers']} workers, {s['turns']} calls of {s['latency']}s, "
        f"cap {s['rpm']:g} requests a minute, {s['error_rate']:.0%} answered 500, {repeats} repeat(s)")
    mock = ("--rpm", s["rpm"], "--error-rate", s["error_rate"], "--error-status", 500, "--retry-after", 1)
    noisy = ("--error-rate", NOISE_SHARE, "--error-status", 429, "--retry-after", NOISE_RETRY_AFTER)
    out: dict[str, Any] = {"setup": s, "ours": [], "ours-direct": [], "noise": [],
                           "other_load_before": other_load_sample()}
    for r in range(repeats):
        kw = dict(n=s["n"], workers=s["workers"], latency=s["latency"], turns=s["turns"], docker=False,
                  tag=f"w6r{r}", timeout=timeout, mock_options=mock)
        for system in ("ours",) + (("ours-direct",) if direct_variant else ()):
            run = systems.run(system, **kw)
            run["w6"] = figures(run, s)
            f = run["w6"]
            log(f"    {system}: {f['throughput_share']:.0%} of what the cap allows, {f['share_429']:.1%} of requests "
                f"answered 429, {f['done']}/{s['n']} prompts done in one invocation")
            out[system].append(run)
        for system in ("ours",) + (("ours-direct",) if direct_variant else ()):
            pair = {"system": system}
            for case, options in (("clean", ()), ("noisy", noisy)):
                run = systems.run(system, **{**kw, "latency": NOISE_LATENCY, "tag": f"w6{case}r{r}",
                                             "mock_options": options})
                pair[case] = {"run": run, "figures": noise_figures(run)}
            pair["ratio"] = ratio(pair)
            log(f"    {system}, random 429s: goodput {pair['ratio'] or 0:.2f} of the clean run's "
                f"(bound {noise_bound():.2f}), {pair['noisy']['figures']['done']}/{s['n']} done, "
                f"{pair['noisy']['figures']['failed']} failed")
            out["noise"].append(pair)
    return out


def noise_bound() -> float:
    p, L, S = NOISE_SHARE, NOISE_LATENCY, NOISE_RETRY_AFTER
    return (1 - p) * L / (L + p * S)


def noise_figures(run: dict[str, Any]) -> dict[str, Any]:
    stats = run.get("mock_stats") or {}
    span, done = run.get("steady") or 0.0, run.get("written", 0)
    requests = stats.get("requests", 0)
    return {"done": done, "failed": run.get("prompts_failed"), "rc": run.get("rc"), "span": span,
            "wall": run.get("wall"), "requests": requests, "throttled": stats.get("injected_errors", 0),
            "share_429": stats.get("injected_errors", 0) / requests if requests else 0.0,
            "goodput_per_min": done / span * 60 if span else 0.0,
            "goodput_wall_per_min": done / run["wall"] * 60 if run.get("wall") else 0.0,
            "failure_reasons": {k: g.get("count") for k, g in (run.get("failure_reasons") or {}).items()}}


def ratio(pair: dict[str, Any]) -> float | None:
    clean = pair["clean"]["figures"]["goodput_per_min"]
    return pair["noisy"]["figures"]["goodput_per_min"] / clean if clean else None


def figures(run: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    stats = run.get("mock_stats") or {}
    requests, ok = stats.get("requests", 0), stats.get("ok", 0)
    span = run.get("steady") or 0.0
    allowed = s["rpm"] / 60.0
    retries = run.get("retries") or {}
    return {
        "requests": requests, "ok": ok, "rate_limited": stats.get("rate_limited", 0),
        "injected_500": stats.get("injected_errors", 0),
        "ok_per_s": ok / span if span else None, "allowed_per_s": allowed,
        "throughput_share": (ok / span / allowed) if span else 0.0,
        "share_429": stats.get("rate_limited", 0) / requests if requests else 0.0,
        "prompts_per_s": (run["n"] / span) if span else None, "allowed_prompts_per_s": allowed / s["turns"],
        "done": run.get("written", 0), "failed": run.get("prompts_failed"), "rc": run.get("rc"),
        "prompts_retried": retries.get("prompts_retried"), "retry_reasons":
            {k: g.get("count") for k, g in (retries.get("reasons") or {}).items()},
    }


def section(w: dict[str, Any]) -> str:
    """The report's part for workload 6: per run, and whether the targets were met."""
    s = w["setup"]
    lines = [f"## Workload 6: {TITLE}\n",
             f"{s['n']} prompts, `--num_workers {s['workers']}`, {s['turns']} model calls per prompt at {s['latency']} s, "
             f"no containers; the model server (`python -m bench.mockserver ... --rpm {s['rpm']:g} --error-rate "
             f"{s['error_rate']:g} --error-status 500`) allows {s['rpm']:g} requests a minute "
             f"({s['rpm'] / 60:g}/s, so {s['rpm'] / 60 / s['turns']:.2f} prompts/s) and answers 500 to "
             f"{s['error_rate']:.0%} of the rest. Busy cores of others just before: {float(w.get('other_load_before') or 0):.2f}.\n",
             "| system | rc | wall s | first→last request s | ok requests/s | share of the cap | requests | 429 | "
             "share 429 | injected 500 | prompts done | prompts retried (why) | targets |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for system in ("ours", "ours-direct"):
        for run in w.get(system) or []:
            f = run["w6"]
            met = (f["throughput_share"] >= THROUGHPUT_TARGET and f["share_429"] <= SHARE_429_TARGET
                   and f["done"] == s["n"] and f["rc"] == 0)
            why = ", ".join(f"{k}: {n}" for k, n in f["retry_reasons"].items()) or "-"
            lines.append(f"| {system} | {f['rc']} | {run['wall']:.1f} | {run.get('steady') or 0:.1f} | "
                         f"{f['ok_per_s'] or 0:.2f} | {f['throughput_share']:.0%} | {f['requests']} | {f['rate_limited']} | "
                         f"{f['share_429']:.1%} | {f['injected_500']} | {f['done']}/{s['n']} | "
                         f"{f['prompts_retried']} ({why}) | {'**met**' if met else '**missed**'} |")
    lines += ["", f"Targets: at least {THROUGHPUT_TARGET:.0%} of what the cap allows between the first and the last "
                  f"request, at most {SHARE_429_TARGET:.0%} of requests answered 429, every prompt done in one "
                  "invocation (rc 0). 'prompts retried' counts prompts that the run put back in the queue after a "
                  "transient failure (the SDK's own retries of a call are not counted there).", ""]
    if w.get("noise"):
        lines += noise_section(w)
    return "\n".join(lines)


def noise_section(w: dict[str, Any]) -> list[str]:
    s = w["setup"]
    lines = [f"### Random 429s beside a clean endpoint\n",
             f"The same {s['n']} prompts, `--num_workers {s['workers']}`, {s['turns']} calls at {NOISE_LATENCY:g} s, "
             f"against the model server answering 429 to {NOISE_SHARE:.0%} of requests at random (`--error-rate "
             f"{NOISE_SHARE:g} --error-status 429 --retry-after {NOISE_RETRY_AFTER:g}`, no cap), each right after the "
             f"same server answering every request. Bound at fixed prompts in flight with Retry-After honoured: "
             f"{noise_bound():.2f} of the clean goodput.\n",
             "| system | endpoint | rc | wall s | first→last request s | requests | 429 | share 429 | prompts done | "
             "failed (why) | goodput, prompts/min | noisy / clean | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for pair in w["noise"]:
        for case in ("clean", "noisy"):
            f = pair[case]["figures"]
            why = ", ".join(f"{k}: {n}" for k, n in f["failure_reasons"].items()) or "-"
            met = ""
            if case == "noisy":
                ok = (pair["ratio"] or 0) >= GOODPUT_TARGET and f["done"] + (f["failed"] or 0) == s["n"] and f["rc"] == 0
                met = "**met**" if ok else "**missed**"
            lines.append(f"| {pair['system']} | {case} | {f['rc']} | {f['wall'] or 0:.1f} | {f['span']:.1f} | "
                         f"{f['requests']} | {f['throttled']} | {f['share_429']:.1%} | {f['done']}/{s['n']} | "
                         f"{f['failed']} ({why}) | {f['goodput_per_min']:.1f} | "
                         f"{'' if case == 'clean' else format(pair['ratio'] or 0, '.2f')} | {met} |")
    lines += ["", f"Target: the noisy run's goodput at least {GOODPUT_TARGET:.0%} of the clean run's (prompts done a "
                  "minute between the first and the last model request), every prompt done or failed with its "
                  "reason, in one invocation (rc 0).", ""]
    return lines
