"""The terminal summary at a run's end: one screen of what happened, and where to look next.

From statistics.json's dict (hermes.run.merge), which stays as it is: only tools that were called,
failure reasons, check results, drops and retries only when there are any, and the commands that
show the run (`hermes-batch view`) and take it away (`hermes-batch export`). The whole table is
still `hermes.data.stats.format_table` (`hermes-batch merge` prints it).
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from hermes.data.run_paths import RunPaths

_EXAMPLE = 100  # characters of a failure's example message


def commands(run_name: str, output_dir: str | Path = "data") -> dict[str, str]:
    """The commands that open and export this run (with --output_dir when it is not the default)."""
    where = "" if str(output_dir) in ("data", "data/") else f" --output_dir {shlex.quote(str(output_dir))}"
    name = shlex.quote(str(run_name))
    return {"view": f"hermes-batch view {name}{where}",
            "export": f"hermes-batch export {name}{where} --format openai"}


def summary_lines(stats: dict[str, Any]) -> list[str]:
    """The summary's lines without the output paths and commands (the Prefect report shows these too)."""
    done = stats.get("prompts_completed", 0) + stats.get("prompts_partial", 0)
    total = stats.get("total_prompts", 0)
    failed, discarded = stats.get("prompts_failed", 0), stats.get("discarded_no_reasoning", 0)
    policy = stats.get("attempt_policy") or {}
    if policy.get("policy", "all") != "all" or policy.get("budget"):  # the policy ran what it wanted of them
        of = f"{done} prompts done (of up to {total} under --attempt_policy {policy['policy']})"
    else:
        of = f"{done} of {total} prompts done"
    lines = [f"Run {stats.get('run_name')}: {of}"
             + (f" ({stats.get('prompts_partial', 0)} stopped at max_turns)" if stats.get("prompts_partial") else "")
             + f", {failed} failed, {discarded} discarded (no reasoning)"]
    usage = stats.get("usage") or {}
    lines.append(f"  {stats.get('trajectories_written', 0)} trajectories written, {stats.get('api_calls', 0)} model calls, "
                 f"{usage.get('total_tokens', 0)} tokens, {_seconds(stats.get('duration_seconds'))}"
                 f"; model {stats.get('model')}, distribution {stats.get('distribution')}")

    drops = [f"{stats[k]} {text}" for k, text in (("dropped_hallucinated_tools", "called a tool that does not exist"),
                                                   ("dropped_check_failed", "failed their check"),
                                                   ("dropped_unchecked", "had no check")) if stats.get(k)]
    if drops:
        lines.append("  left out: " + ", ".join(drops))

    checks = stats.get("check_statistics") or {}
    if checks.get("checked"):
        lines.append(f"Checks: {checks['passed']} of {checks['checked']} passed ({checks.get('pass_rate', 0.0):.1f}%)"
                     + (f", {checks['timed_out']} timed out" if checks.get("timed_out") else ""))

    lines += attempt_lines(stats)

    reasons = stats.get("failure_reasons") or {}
    if reasons:
        lines.append("Failures by kind:")
        lines += [f"  {g['count']:>5} × {kind}  (e.g. {_short(g.get('example', ''))})" for kind, g in reasons.items()]
    retries = stats.get("retries") or {}
    if retries.get("prompts_retried"):
        lines.append(f"Retried: {retries['prompts_retried']} prompts, {retries.get('prompts_recovered', 0)} then succeeded")

    used = sorted(((name, s) for name, s in (stats.get("tool_statistics") or {}).items() if s.get("count")),
                  key=lambda kv: (-kv[1]["count"], kv[0]))
    if used:
        width = max(len(name) for name, _ in used)
        lines.append("Tools used:")
        lines += [f"  {name.ljust(width)}  {s['count']:>6} calls" + (f", {s['failure']} failed ({s.get('failure_rate', 0.0):.1f}%)"
                                                                    if s.get("failure") else "") for name, s in used]
    else:
        lines.append("Tools used: none")

    lines += tool_use_lines(stats)

    reasoning = stats.get("reasoning_statistics") or {}
    if reasoning.get("total_assistant_turns"):
        with_r, turns = reasoning.get("turns_with_reasoning", 0), reasoning["total_assistant_turns"]
        lines.append(f"Reasoning: {with_r} of {turns} assistant turns ({with_r / turns:.0%})")
    return lines


def attempt_lines(stats: dict[str, Any]) -> list[str]:
    """--attempts K: what was solved and what it cost; under a policy, what it saved (hermes.run.attempt_policy)."""
    block = stats.get("attempt_policy") or {}
    if not block:
        return []
    tasks, solved = block.get("tasks", 0), block.get("tasks_solved", 0)
    lines = [f"Attempts ({block.get('policy')}, up to {block.get('k')} a task): {solved} of {tasks} tasks solved"
             + (f" ({solved / tasks:.0%})" if tasks else "")
             + f", {block.get('attempts_spent', 0)} attempts spent"
             + (f", {block['attempts_saved']} saved against all" if block.get("attempts_saved") else "")
             + (f", {block['attempts_per_solved_task']} per solved task" if block.get("attempts_per_solved_task") else "")
             + (f", {block['attempts_stopped']} stopped in flight" if block.get("attempts_stopped") else "")]
    if block.get("policy") == "informative" or block.get("groups_with_signal"):
        lines.append(f"  groups with signal (a pass and a fail): {block.get('groups_with_signal', 0)} of "
                     f"{block.get('tasks_judged', 0)} tasks judged")
    pass_at = (stats.get("task_statistics") or {}).get("pass_at_k") or {}
    if pass_at:
        lines.append("  pass@k: " + ", ".join(f"@{k} {v:.3f}" for k, v in pass_at.items() if v is not None))
    elif absent := (stats.get("task_statistics") or {}).get("pass_at_k_absent"):
        lines.append(f"  pass@k not given: {absent}")
    return lines


def tool_use_lines(stats: dict[str, Any]) -> list[str]:
    """How the agents acted (hermes.run.tool_use): calls by how they arrived; the warning when most never did."""
    block = stats.get("tool_use") or {}
    if not block.get("prompts_offered_tools"):
        return []
    calls = block.get("calls_by_format") or {}
    arrived = ", ".join(f"{n} {fmt}" for fmt, n in calls.items()) or "none"
    lines = [f"Tool use: {block.get('prompts_acted', 0)} of {block['prompts_offered_tools']} prompts offered tools "
             f"called one; calls by how they arrived: {arrived}"]
    if block.get("warning"):
        lines += ["", "!" * 72, f"WARNING: {block['warning']}", "!" * 72]
    return lines


def format_summary(stats: dict[str, Any], output_dir: str | Path = "data") -> str:
    """The whole terminal summary: summary_lines, then the output files and the commands to look at them."""
    paths = RunPaths.of(output_dir, str(stats.get("run_name")))
    cmd = commands(str(stats.get("run_name")), output_dir)
    return "\n".join(summary_lines(stats) + [
        "",
        f"trajectories: {paths.trajectories}",
        f"statistics:   {paths.statistics}",
        f"look at it:   {cmd['view']}",
        f"export it:    {cmd['export']}   (or --format sharegpt, parquet)",
    ])


def _short(text: Any) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _EXAMPLE else text[:_EXAMPLE] + "…"


def _seconds(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "- s"
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"
