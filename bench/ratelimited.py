"""Workload 6: an endpoint that enforces a requests-per-minute cap and injects 5xx.

    python -m bench --workloads 6 [--w6-rpm 600 --w6-prompts 200 --w6-workers 64]

The bundled model server with `--rpm R` (a provider's tier: 429 at once beyond R a minute, one
second's worth at a time, Retry-After and x-ratelimit-* headers) and `--error-rate P
--error-status 500`. Ours as a user runs it by default (a Prefect flow), and with --engine direct.
Targets (issue 21): throughput at least 90% of what R allows, 429s at most 10% of requests,
and every prompt done in ONE invocation.

"What R allows" is R/60 requests a second over the span from the first model request to the
last (the server's burst lets a little more through at the start); a prompt needs `turns`
successful requests, so R allows R / 60 / turns prompts a second.
"""
from __future__ import annotations

from typing import Any

TITLE = "Rate-limited endpoint (requests-a-minute cap, 429 and injected 5xx)"
THROUGHPUT_TARGET, SHARE_429_TARGET = 0.90, 0.10


def spec(a: Any) -> dict[str, Any]:
    return dict(title=TITLE, n=a.w6_prompts, workers=a.w6_workers, latency=a.w6_latency, turns=3, docker=False,
                rpm=a.w6_rpm, error_rate=a.w6_error_rate)


def run_workload(s: dict[str, Any], systems: Any, repeats: int, timeout: float, direct_variant: bool) -> dict[str, Any]:
    from bench.common import log, other_load_sample

    log(f"workload 6: {TITLE}: {s['n']} prompts, {s['workers']} workers, {s['turns']} calls of {s['latency']}s, "
        f"cap {s['rpm']:g} requests a minute, {s['error_rate']:.0%} answered 500, {repeats} repeat(s)")
    mock = ("--rpm", s["rpm"], "--error-rate", s["error_rate"], "--error-status", 500, "--retry-after", 1)
    out: dict[str, Any] = {"setup": s, "ours": [], "ours-direct": [], "other_load_before": other_load_sample()}
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
    return out


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
    return "\n".join(lines)
