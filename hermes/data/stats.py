"""Per-entry tool and reasoning statistics, quality checks, and run-level aggregation.

Tool results are named with the same rule as the trajectory's tool turns
(``hermes.data.trajectory.tool_results``), and "has reasoning" means exactly "its gpt turn
gets a non-empty think block" (``hermes.data.trajectory.split_reasoning``), so statistics
never disagree with the trajectories they describe.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

from hermes.data.trajectory import content_text, split_reasoning, tool_results

REASONING_KEYS = ("total_assistant_turns", "turns_with_reasoning", "turns_without_reasoning")


# --------------------------------------------------------------------------- tool results

def is_tool_failure(content: Any) -> bool:
    """Whether a tool result counts as a failure (SPEC section 1).

    Failure: a JSON object with a non-null ``error`` or a non-null ``content.error``, or
    ``"success": false``; empty or whitespace-only text; text starting with ``error:``
    (any case, after leading whitespace). Other JSON (arrays, numbers, strings) and other
    text are successes: a non-zero exit code is not a failure, the model can self-correct.
    """
    if isinstance(content, dict):
        data = content  # already parsed by whoever built the message
    else:  # str, None, or a list of content parts
        text = content_text(content)
        if not text.strip():
            return True
        try:
            data = json.loads(text)
        except ValueError:
            return text.lstrip().lower().startswith("error:")
    if not isinstance(data, dict):
        return False
    inner = data.get("content")
    return (data.get("error") is not None
            or (isinstance(inner, dict) and inner.get("error") is not None)
            or data.get("success") is False)


def entry_tool_stats(messages: list[dict], all_tool_names: list[str]) -> tuple[dict, dict]:
    """``(tool_stats, tool_error_counts)`` of one conversation.

    Both list every name in ``all_tool_names``, zeros included, sorted by name, so every
    trajectory line has the same schema. ``count`` is the number of tool RESULTS (so
    count == success + failure always; a call interrupted before its result is not
    counted). Results of tools outside the list are ignored: such a call makes the entry
    hallucinated (see ``hallucinated_tools``) and it is filtered at merge.
    """
    stats = {name: {"count": 0, "success": 0, "failure": 0} for name in sorted(set(all_tool_names))}
    for name, msg in tool_results(messages):
        if name not in stats:
            continue
        outcome = "failure" if is_tool_failure(msg.get("content")) else "success"
        stats[name]["count"] += 1
        stats[name][outcome] += 1
    errors = {name: s["failure"] for name, s in stats.items()}
    return stats, errors


def hallucinated_tools(messages: list[dict], all_tool_names: list[str]) -> list[str]:
    """Sorted unique names the assistant called that the system does not have."""
    known = set(all_tool_names)
    called = {
        (call.get("function") or {}).get("name", "")
        for msg in messages if msg.get("role") == "assistant"
        for call in (msg.get("tool_calls") or []) if isinstance(call, dict)
    }
    return sorted(called - known)


# --------------------------------------------------------------------------- reasoning

def turn_has_reasoning(assistant_message: dict) -> bool:
    """Native reasoning, a scratchpad or a ``<think>`` block with non-whitespace inside."""
    reasoning, _ = split_reasoning(assistant_message)
    return bool(reasoning)


def reasoning_counts(messages: list[dict]) -> dict:
    """``{"total_assistant_turns", "turns_with_reasoning", "turns_without_reasoning"}``."""
    turns = [m for m in messages if m.get("role") == "assistant"]
    with_reasoning = sum(1 for m in turns if turn_has_reasoning(m))
    return {"total_assistant_turns": len(turns),
            "turns_with_reasoning": with_reasoning,
            "turns_without_reasoning": len(turns) - with_reasoning}


def has_any_reasoning(messages: list[dict]) -> bool:
    """Whether any assistant turn carries reasoning (else the sample is discarded)."""
    return any(turn_has_reasoning(m) for m in messages if m.get("role") == "assistant")


# --------------------------------------------------------------------------- run level

def _percent(part: int, whole: int) -> float:
    return round(part / whole * 100, 2) if whole else 0.0


def add_tool_stats(totals: dict[str, dict], tool_stats: dict | None) -> dict[str, dict]:
    """Add one entry's ``tool_stats`` into running ``totals`` (so a run is summed in one pass)."""
    for name, s in (tool_stats or {}).items():
        t = totals.setdefault(name, {"count": 0, "success": 0, "failure": 0})
        for key in t:
            t[key] += s.get(key, 0)
    return totals


def aggregate_tool_stats(entries: Iterable[dict]) -> dict:
    """Sum per-entry ``tool_stats`` dicts; add success/failure rates in percent (2 decimals)."""
    totals: dict[str, dict] = {}
    for tool_stats in entries:
        add_tool_stats(totals, tool_stats)
    return {name: {**t, "success_rate": _percent(t["success"], t["count"]),
                   "failure_rate": _percent(t["failure"], t["count"])}
            for name, t in sorted(totals.items())}


def add_reasoning(totals: dict[str, int], counts: dict | None) -> dict[str, int]:
    """Add one entry's ``reasoning_counts`` into running ``totals`` (other keys are ignored)."""
    for key in REASONING_KEYS:
        totals[key] = totals.get(key, 0) + (counts or {}).get(key, 0)
    return totals


def aggregate_reasoning(entries: Iterable[dict]) -> dict:
    """Sum per-entry ``reasoning_counts`` dicts (other keys are ignored)."""
    totals = dict.fromkeys(REASONING_KEYS, 0)
    for counts in entries:
        add_reasoning(totals, counts)
    return totals


def add_reward(totals: dict[str, Any], reward: dict | None) -> dict[str, Any]:
    """Add one entry's row-check `reward` (hermes.data.entry.Reward) into running `totals`."""
    if not isinstance(reward, dict):
        return totals
    totals["checked"] = totals.get("checked", 0) + 1
    totals["passed"] = totals.get("passed", 0) + bool(reward.get("passed"))
    totals["timed_out"] = totals.get("timed_out", 0) + bool(reward.get("timed_out"))
    codes = totals.setdefault("exit_codes", {})
    code = str(reward.get("exit_code"))
    codes[code] = codes.get(code, 0) + 1
    return totals


def aggregate_rewards(totals: dict[str, Any]) -> dict[str, Any]:
    """statistics.json's `check_statistics`: how many entries a row check judged, how many
    passed (and the rate, in percent), and the distribution of its exit codes."""
    checked, passed = totals.get("checked", 0), totals.get("passed", 0)
    codes = totals.get("exit_codes", {})
    return {"checked": checked, "passed": passed, "failed": checked - passed,
            "pass_rate": _percent(passed, checked), "timed_out": totals.get("timed_out", 0),
            "exit_codes": dict(sorted(codes.items(), key=lambda kv: (-kv[1], kv[0])))}


def add_trial(totals: dict[str, list], task: str, reward: dict | None) -> None:
    """Count one judged attempt of `task` (its key without the attempt, hermes.data.dataset.split_attempt,
    or a task folder's name): [attempts, passed]."""
    if isinstance(reward, dict):
        counts = totals.setdefault(task, [0, 0])
        counts[0] += 1
        counts[1] += bool(reward.get("passed"))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of Chen et al. 2021 (Codex): 1 - C(n-c, k) / C(n, k), the chance that
    at least one of k attempts drawn from the n made (c of them passing) passes."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def aggregate_trials(totals: dict[str, list], attempts: int) -> dict[str, Any]:
    """statistics.json's `task_statistics`: per task its judged attempts, passes and pass rate (percent),
    and pass@k for k = 1 .. attempts, the mean over the tasks judged at least k times."""
    tasks = {name: {"attempts": n, "passed": c, "pass_rate": _percent(c, n)} for name, (n, c) in sorted(totals.items())}
    at_k = {}
    for k in range(1, max(1, attempts) + 1):
        judged = [(n, c) for n, c in totals.values() if n >= k]
        at_k[str(k)] = round(sum(pass_at_k(n, c, k) for n, c in judged) / len(judged), 6) if judged else None
    return {"tasks": tasks, "pass_at_k": at_k}


def format_table(statistics: dict) -> str:
    """A run's statistics dict (statistics.json shape) as plain text for the terminal.

    Scalars first as ``key: value`` lines, then the tool table (busiest tools first),
    then reasoning coverage with the share of turns that reasoned; any other nested dict
    is shown as indented ``key: value`` lines so nothing is silently hidden.
    """
    tools = statistics.get("tool_statistics") or {}
    reasoning = statistics.get("reasoning_statistics") or {}
    scalars = {k: v for k, v in statistics.items() if not isinstance(v, (dict, list))}
    others = {k: v for k, v in statistics.items()
              if isinstance(v, (dict, list)) and k not in ("tool_statistics", "reasoning_statistics")}

    lines = []
    width = max((len(k) for k in scalars), default=0)
    lines += [f"{k.ljust(width)}  {_scalar(v)}" for k, v in scalars.items()]

    header = ("tool", "count", "success", "failure", "success %", "failure %")
    rows = [(name, str(s.get("count", 0)), str(s.get("success", 0)), str(s.get("failure", 0)),
             f"{s.get('success_rate', 0.0):.2f}", f"{s.get('failure_rate', 0.0):.2f}")
            for name, s in sorted(tools.items(), key=lambda kv: (-kv[1].get("count", 0), kv[0]))]
    lines += ["", "Tool statistics"] + (_grid(header, rows) if rows else ["  (no tools)"])

    if reasoning:
        total = reasoning.get("total_assistant_turns", 0)
        with_r = reasoning.get("turns_with_reasoning", 0)
        lines += ["", "Reasoning statistics"]
        lines += [f"  {k}: {v}" for k, v in reasoning.items()]
        lines.append(f"  share_with_reasoning: {_percent(with_r, total):.2f}%")

    for key, value in others.items():
        lines += ["", key]
        lines += _nested(value, "  ")
    return "\n".join(lines).strip("\n")


def _nested(value: Any, indent: str) -> list[str]:
    # failures grouped by kind ({kind: {"count", "example"}}, hermes.data.failures.group) read as a list
    if isinstance(value, dict) and value and all(isinstance(v, dict) and "count" in v for v in value.values()):
        return [f"{indent}{g['count']:>5} × {kind}  (e.g. {str(g.get('example', ''))[:160]})" for kind, g in value.items()]
    items = value.items() if isinstance(value, dict) else enumerate(value)
    lines = []
    for k, v in items:
        if isinstance(v, (dict, list)):
            lines += [f"{indent}{k}:"] + (_nested(v, indent + "  ") if v else [])
        else:
            lines.append(f"{indent}{k}: {_scalar(v)}")
    return lines


def _scalar(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "-" if value is None else str(value)


def _grid(header: tuple, rows: list[tuple]) -> list[str]:
    # Names left-aligned, numbers right-aligned, columns as wide as their widest cell.
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple) -> str:
        return "  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                for i, (c, w) in enumerate(zip(cells, widths)))

    return [line(header), "  " + "  ".join("-" * w for w in widths)] + [line(r) for r in rows]
