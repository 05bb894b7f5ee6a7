"""Merge: the journal (batch files) -> trajectories.jsonl + statistics.json.

Per content key the first successful entry wins, so a prompt is written once however many
attempts it took. Kept: completed and partial entries; left out and counted: failed prompts,
samples without reasoning (discarded when they ran), entries calling a tool the system does
not have, and with require_check_pass (the run's --require_check_pass) entries whose row check
did not pass or that had none. The checks' outcomes are summed in `check_statistics`.

Memory is bounded whatever the run's size: no per-trajectory Python objects are kept; the run's
DuckDB index (hermes.data.run_index) answers which line wins for each key and which prompts never
succeeded (under a memory_limit), and the batch files are read once, line by line, in order. A line the runner wrote is copied up to its
`hermes` block, never decoded whole nor re-encoded (hermes.data.journal_lines.split_entry).
"""
from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from hermes.data.run_paths import RunPaths
from hermes.data import journal
from hermes.run import rundir
from hermes.data.entry import KEPT, Status
from hermes.data.failures import group
from hermes.data.dataset import split_attempt
from hermes.data.stats import add_trial, aggregate_trials
from hermes.data.stats import (add_reasoning, add_reward, add_tool_stats, aggregate_reasoning, aggregate_rewards,
                          aggregate_tool_stats)
from hermes.data.journal_lines import hermes_block, journal_lines, split_entry
from hermes.data.run_index import IndexBusy, RunIndex
from hermes.run.tool_use import add_tool_use, aggregate_tool_use
from hermes.run.attempt_policy import AttemptPolicy


def merge(run_path: Path, require_check_pass: bool | None = None) -> dict[str, Any]:
    """require_check_pass: None takes the run's own setting (its manifest)."""
    manifest = rundir.read_manifest(run_path)
    if require_check_pass is None:
        require_check_pass = bool((manifest.get("settings") or {}).get("require_check_pass"))
    index = _open_index(run_path)
    try:
        paths = RunPaths(run_path)
        tmp = paths.trajectories.with_name("." + paths.trajectories.name + ".tmp")
        with open(tmp, "wb", buffering=1 << 20) as out:
            totals = _copy_winners(index, out, require_check_pass)
        tmp.replace(paths.trajectories)
        final_errors = index.final_errors()
        retried = index.retried_attempts()
        total_prompts = manifest["total_prompts"] if "total_prompts" in manifest else index.prompt_count()
        batches = index.batch_count()
    finally:
        index.close()

    counts = totals["counts"]
    stats = {
        "run_name": manifest.get("run_name", run_path.name),
        "distribution": manifest.get("distribution"),
        "total_prompts": total_prompts,
        "total_batches": batches,
        "batch_size": manifest.get("batch_size"),
        "model": manifest.get("model"),
        "completed_at": datetime.now().isoformat(timespec="seconds"),
        "duration_seconds": rundir.total_seconds(run_path),
        "tool_statistics": aggregate_tool_stats([totals["tools"]]),
        "reasoning_statistics": aggregate_reasoning([totals["reasoning"]]),
        "trajectories_written": counts["completed"] + counts["partial"],
        "prompts_completed": counts["completed"],
        "prompts_partial": counts["partial"],
        "prompts_failed": len(final_errors),
        # by kind (hermes.data.failures), each with a count of prompts and one of their messages
        "failure_reasons": group(final_errors),
        "retries": retry_stats(retried),
        "discarded_no_reasoning": counts["discarded_no_reasoning"],
        "dropped_hallucinated_tools": counts["dropped_hallucinated_tools"],
        "require_check_pass": require_check_pass,
        "dropped_check_failed": counts["dropped_check_failed"],
        "dropped_unchecked": counts["dropped_unchecked"],
        "check_statistics": aggregate_rewards(totals["rewards"]),
        # prompts offered tools, how many acted, calls by how they arrived (native or a text format)
        "tool_use": aggregate_tool_use(totals["tool_use"]),
        "api_calls": totals["api_calls"],
        "usage": {k: totals["usage"].get(k, 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
        # auxiliary model calls of tools (vision, image_gen), by kind, apart from the agent's own usage
        "aux_usage": {kind: dict(sorted(c.items())) for kind, c in sorted(totals["aux_usage"].items())},
    }
    settings = manifest.get("settings") or {}
    policy = AttemptPolicy.of_manifest(settings)
    if totals["trials"]:  # rows were judged: per task its attempts and pass rate, pass@k for k = 1 .. --attempts
        stats["task_statistics"] = aggregate_trials(totals["trials"], policy.k)
        if policy.dynamic:  # attempts not independent, nor K a task: the estimator does not apply
            del stats["task_statistics"]["pass_at_k"]
            stats["task_statistics"]["pass_at_k_absent"] = policy.why_no_pass_at_k()
    if policy.dynamic or policy.k > 1:
        stats["attempt_policy"] = policy.statistics(totals["trials"], tasks=total_prompts // max(policy.k, 1),
                                                    stopped=counts["stopped_by_policy"], failed=len(final_errors))
    journal.write_atomic(RunPaths(run_path).statistics, json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    return stats


def _open_index(run_path: Path) -> RunIndex:
    # An active run holds the index file (DuckDB: one process per file): read the journal privately.
    try:
        return RunIndex(run_path, lean=True)
    except IndexBusy:
        return RunIndex(run_path, database=":memory:", lean=True)


def _copy_winners(index: RunIndex, out: BinaryIO, require_check_pass: bool = False) -> dict[str, Any]:
    """Write each key's winning line without its hermes block; sum what statistics.json needs."""
    counts: Counter = Counter()
    rewards: dict[str, Any] = {}
    trials: dict[str, list] = {}
    usage: Counter = Counter()
    aux_usage: dict[str, Counter] = {}
    tools: dict[str, dict] = {}
    reasoning: dict[str, int] = {}
    tool_use: dict[str, Any] = {}
    api_calls = 0
    for num, path, size, wins in index.winning_files():
        for line, raw in journal_lines(path, size):
            parsed = split_entry(raw)
            if parsed is None:
                continue
            head, tail = parsed
            meta = hermes_block(tail)
            # Every attempt counts towards calls and tokens, failed and duplicate ones too.
            api_calls += tail.get("api_calls", 0)
            usage.update({k: v for k, v in (meta.get("usage") or {}).items() if isinstance(v, int)})
            add_aux_usage(aux_usage, meta.get("aux_usage"))
            if line not in wins:
                continue
            status = meta.get("status")
            if status == Status.STOPPED:  # the attempt policy stopped it in flight: no verdict, no trajectory
                counts["stopped_by_policy"] += 1
                continue
            if status != Status.FAILED:
                add_tool_use(tool_use, tail.get("toolsets_used"), meta)
            if status not in KEPT:
                counts["discarded_no_reasoning"] += 1
            elif meta.get("hallucinated_tools"):
                counts["dropped_hallucinated_tools"] += 1
            else:
                reward = tail.get("reward")
                add_reward(rewards, reward)  # every judged entry counts, kept or not
                add_trial(trials, meta.get("task") or split_attempt(str(meta.get("key")))[0], reward)
                if require_check_pass and not (isinstance(reward, dict) and reward.get("passed")):
                    # rejection sampling: judged and found wanting, or never judged
                    counts["dropped_unchecked" if reward is None else "dropped_check_failed"] += 1
                    continue
                counts[status] += 1
                add_tool_stats(tools, tail.get("tool_stats"))
                add_reasoning(reasoning, meta.get("reasoning"))
                out.write(head if head is not None else _without_hermes(tail))
    return {"counts": counts, "usage": usage, "aux_usage": aux_usage, "tools": tools, "reasoning": reasoning,
            "api_calls": api_calls, "rewards": rewards, "trials": trials, "tool_use": tool_use}


def add_aux_usage(totals: dict[str, Counter], aux: Any) -> None:
    """Add one entry's hermes.aux_usage ({kind: {"calls", token counts...}}) into running totals."""
    for kind, counts in (aux or {}).items() if isinstance(aux, dict) else ():
        if isinstance(counts, dict):
            totals.setdefault(str(kind), Counter()).update(
                {k: v for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool)})


def _without_hermes(entry: dict[str, Any]) -> bytes:
    """A line of another shape than the runner's: decoded whole, so encoded again."""
    return (json.dumps({k: v for k, v in entry.items() if k != "hermes"}, ensure_ascii=False) + "\n").encode("utf-8")


def retry_stats(retried: list[tuple[str, str | None, bool]]) -> dict[str, Any]:
    """How many prompts needed another attempt, how many of them then succeeded, and why they
    were tried again: the failed attempts by kind (a prompt tried three times counts twice)."""
    keys = {key: ok for key, _, ok in retried}
    return {"prompts_retried": len(keys), "prompts_recovered": sum(keys.values()),
            "attempts_retried": len(retried), "reasons": group(error for _, error, _ in retried)}


_PREVIEW = 160  # characters of a failed prompt shown in reports


def failed_prompts(run_path: Path, limit: int = 500) -> list[dict[str, Any]]:  # 500 rows keep the UI usable
    """The prompts whose latest outcome is a failure and that never succeeded, with their reasons.

    Read from the journal (the batch files), as merge does: a prompt that failed and later
    succeeded on --resume is not listed.
    """
    last_failed: dict[str, dict[str, Any]] = {}
    succeeded: set[str] = set()
    for _, path in journal.batch_files(run_path):
        for entry in journal.read(path):
            meta = entry.get("hermes") or {}
            key = meta.get("key")
            if meta.get("status") == Status.FAILED:
                last_failed[key] = entry
            else:
                succeeded.add(key)
    rows = []
    for key, entry in last_failed.items():
        if key in succeeded:
            continue
        meta = entry.get("hermes") or {}
        human = next((t.get("value", "") for t in entry.get("conversations", []) if t.get("from") == "human"), "")
        preview = " ".join(str(human).split())
        rows.append({
            "prompt_index": entry.get("prompt_index"),
            "batch": (entry.get("metadata") or {}).get("batch_num"),
            "reason": (meta.get("error") or "unknown error").strip()[:500],
            "prompt": preview[:_PREVIEW] + ("…" if len(preview) > _PREVIEW else ""),
        })
    rows.sort(key=lambda r: (r["prompt_index"] is None, r["prompt_index"]))
    return rows[:limit]
