"""Merge: the journal (batch files) -> trajectories.jsonl + statistics.json.

Streams the batch files once, in batch order. Per content key the first successful entry wins,
so a prompt is written once however many attempts it took. Kept: completed and partial
entries; left out and counted: failed prompts, samples without reasoning (discarded when they
ran) and entries calling a tool the system does not have.
"""
from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from hermes import journal, rundir
from hermes.stats import add_reasoning, add_tool_stats, aggregate_reasoning, aggregate_tool_stats

KEPT = ("completed", "partial")


def merge(run_path: Path) -> dict[str, Any]:
    manifest = rundir.read_manifest(run_path)
    done: set[str] = set()
    last_failure: dict[str, str] = {}
    counts = Counter()
    tool_totals: dict[str, dict] = {}  # summed as we go: memory does not grow with the run
    reasoning_totals: dict[str, int] = {}
    usage = Counter()
    api_calls = 0
    batches = journal.batch_files(run_path)
    tmp = run_path / ".trajectories.jsonl.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for _, path in batches:
            for entry in journal.read(path):
                meta = entry.get("hermes") or {}
                key, status = meta.get("key"), meta.get("status")
                api_calls += entry.get("api_calls", 0)
                usage.update({k: v for k, v in (meta.get("usage") or {}).items() if isinstance(v, int)})
                if status == "failed":
                    last_failure[key] = meta.get("error") or "unknown error"
                    continue
                if key in done:
                    counts["duplicates_ignored"] += 1
                    continue
                done.add(key)
                if status not in KEPT:
                    counts["discarded_no_reasoning"] += 1
                    continue
                if meta.get("hallucinated_tools"):
                    counts["dropped_hallucinated_tools"] += 1
                    continue
                counts[status] += 1
                add_tool_stats(tool_totals, entry["tool_stats"])
                add_reasoning(reasoning_totals, meta.get("reasoning"))
                out.write(json.dumps({k: v for k, v in entry.items() if k != "hermes"}, ensure_ascii=False) + "\n")
        out.flush()
    tmp.replace(run_path / "trajectories.jsonl")

    failed = {k: e for k, e in last_failure.items() if k not in done}
    stats = {
        "run_name": manifest.get("run_name", run_path.name),
        "distribution": manifest.get("distribution"),
        "total_prompts": manifest.get("total_prompts", len(done) + len(failed)),
        "total_batches": len(batches),
        "batch_size": manifest.get("batch_size"),
        "model": manifest.get("model"),
        "completed_at": datetime.now().isoformat(timespec="seconds"),
        "duration_seconds": rundir.total_seconds(run_path),
        "tool_statistics": aggregate_tool_stats([tool_totals]),
        "reasoning_statistics": aggregate_reasoning([reasoning_totals]),
        "trajectories_written": counts["completed"] + counts["partial"],
        "prompts_completed": counts["completed"],
        "prompts_partial": counts["partial"],
        "prompts_failed": len(failed),
        "failure_reasons": dict(Counter(_reason(e) for e in failed.values()).most_common()),
        "discarded_no_reasoning": counts["discarded_no_reasoning"],
        "dropped_hallucinated_tools": counts["dropped_hallucinated_tools"],
        "api_calls": api_calls,
        "usage": {k: usage.get(k, 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
    }
    journal.write_atomic(run_path / "statistics.json", json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    return stats


def _reason(error: str) -> str:
    """Group failures by the first line of their message, cut short, so the counts stay readable."""
    return error.splitlines()[0][:120] if error else "unknown error"


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
            if meta.get("status") == "failed":
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
