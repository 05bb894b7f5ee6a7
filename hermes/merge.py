"""Merge: the journal (batch files) -> trajectories.jsonl + statistics.json.

Per content key the first successful entry wins, so a prompt is written once however many
attempts it took. Kept: completed and partial entries; left out and counted: failed prompts,
samples without reasoning (discarded when they ran) and entries calling a tool the system does
not have.

Memory is bounded whatever the run's size: no per-trajectory Python objects are kept; the run's
DuckDB index (hermes.run_index) answers which line wins for each key and which prompts never
succeeded (under a memory_limit), and the batch files are read once, line by line, in order. A line the runner wrote is copied up to its
`hermes` block, never decoded whole nor re-encoded (hermes.run_index.split_entry).
"""
from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from hermes import journal, rundir
from hermes.entry import KEPT, Status
from hermes.stats import add_reasoning, add_tool_stats, aggregate_reasoning, aggregate_tool_stats
from hermes.run_index import IndexBusy, RunIndex, hermes_block, journal_lines, split_entry


def merge(run_path: Path) -> dict[str, Any]:
    manifest = rundir.read_manifest(run_path)
    index = _open_index(run_path)
    try:
        tmp = run_path / ".trajectories.jsonl.tmp"
        with open(tmp, "wb", buffering=1 << 20) as out:
            totals = _copy_winners(index, out)
        tmp.replace(run_path / "trajectories.jsonl")
        reasons = index.failure_reasons()
        total_prompts = manifest["total_prompts"] if "total_prompts" in manifest else index.prompt_count()
        batches = len(index.files())
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
        "prompts_failed": sum(n for _, n in reasons),
        "failure_reasons": dict(reasons),
        "discarded_no_reasoning": counts["discarded_no_reasoning"],
        "dropped_hallucinated_tools": counts["dropped_hallucinated_tools"],
        "api_calls": totals["api_calls"],
        "usage": {k: totals["usage"].get(k, 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
        # auxiliary model calls of tools (vision, image_gen), by kind, apart from the agent's own usage
        "aux_usage": {kind: dict(sorted(c.items())) for kind, c in sorted(totals["aux_usage"].items())},
    }
    journal.write_atomic(run_path / "statistics.json", json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    return stats


def _open_index(run_path: Path) -> RunIndex:
    # An active run holds the index file (DuckDB: one process per file): read the journal privately.
    try:
        return RunIndex(run_path, lean=True)
    except IndexBusy:
        return RunIndex(run_path, database=":memory:", lean=True)


def _copy_winners(index: RunIndex, out: BinaryIO) -> dict[str, Any]:
    """Write each key's winning line without its hermes block; sum what statistics.json needs."""
    counts: Counter = Counter()
    usage: Counter = Counter()
    aux_usage: dict[str, Counter] = {}
    tools: dict[str, dict] = {}
    reasoning: dict[str, int] = {}
    api_calls = 0
    winners = index.winners()
    for num, path, size in index.files():
        wins = winners.get(num, b"")
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
            if not wins[line >> 3] & (1 << (line & 7)):
                continue
            status = meta.get("status")
            if status not in KEPT:
                counts["discarded_no_reasoning"] += 1
            elif meta.get("hallucinated_tools"):
                counts["dropped_hallucinated_tools"] += 1
            else:
                counts[status] += 1
                add_tool_stats(tools, tail.get("tool_stats"))
                add_reasoning(reasoning, meta.get("reasoning"))
                out.write(head if head is not None else _without_hermes(tail))
    return {"counts": counts, "usage": usage, "aux_usage": aux_usage, "tools": tools, "reasoning": reasoning,
            "api_calls": api_calls}


def add_aux_usage(totals: dict[str, Counter], aux: Any) -> None:
    """Add one entry's hermes.aux_usage ({kind: {"calls", token counts...}}) into running totals."""
    for kind, counts in (aux or {}).items() if isinstance(aux, dict) else ():
        if isinstance(counts, dict):
            totals.setdefault(str(kind), Counter()).update(
                {k: v for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool)})


def _without_hermes(entry: dict[str, Any]) -> bytes:
    """A line of another shape than the runner's: decoded whole, so encoded again."""
    return (json.dumps({k: v for k, v in entry.items() if k != "hermes"}, ensure_ascii=False) + "\n").encode("utf-8")


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
