"""`hermes-batch export --format rl`: one line per entry with what an RL trainer reads.

    {"prompt_index", "key", "group" (the task: its attempts' group), "attempt", "messages", "tools" (JSON text), "reward" (the check's value; 1.0 or 0.0
     for a plain row check; null without one), "completed", "partial",
     "turns": [{"tokens", "token_ids", "logprobs"}, ...]}   # one per assistant message, in order

The tokens and logprobs are kept in the journal only (the entries' `hermes.logprobs`, --logprobs),
so this export reads the batch files, not trajectories.jsonl: per content key the first kept
entry (completed or partial), as the merge chooses, entries calling a tool the system does not
have left out as the merge leaves them out. `tools` is JSON text as in the Parquet export (as
columns, every tool's parameter schema would merge into one struct). Every line has the same
columns, so `datasets.load_dataset("json", data_files=...)` loads it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from hermes.data import journal
from hermes.data.dataset import split_attempt
from hermes.data.entry import KEPT
from hermes.model.logprobs import token_ids

KEPT_STATUSES = {str(s.value) for s in KEPT}


def winners(run_path: Path) -> Iterator[dict[str, Any]]:
    """The first kept entry of each key, in journal order (a set of keys, not of entries, is held)."""
    seen: set[str] = set()
    for _, path in journal.batch_files(run_path):
        for entry in journal.read(path):
            meta = entry.get("hermes") or {}
            key = meta.get("key")
            if key in seen or meta.get("status") not in KEPT_STATUSES or meta.get("hallucinated_tools"):
                continue
            seen.add(key)
            yield entry


def _reward(entry: dict[str, Any]) -> float | None:
    reward = entry.get("reward")
    if not isinstance(reward, dict):
        return None
    if isinstance(reward.get("value"), (int, float)):
        return float(reward["value"])
    return 1.0 if reward.get("passed") else 0.0


def rl_record(entry: dict[str, Any], chat: dict[str, Any]) -> dict[str, Any]:
    """entry: a journal line; chat: its {"messages", "tools"} (hermes.run.export.openai_record)."""
    meta = entry.get("hermes") or {}
    turns = [{"tokens": t.get("tokens") or [], "token_ids": token_ids(t.get("tokens") or []),
              "logprobs": t.get("logprobs") or []} for t in meta.get("logprobs") or []]
    key = str(meta.get("key"))
    return {"prompt_index": entry.get("prompt_index"), "key": meta.get("key"),
            # the task's attempts share a group (GRPO's): a task folder's name, or the row's key
            "group": meta.get("task") or split_attempt(key)[0], "attempt": int(meta.get("trial") or 1),
            "messages": chat["messages"],
            "tools": json.dumps(chat["tools"], ensure_ascii=False), "reward": _reward(entry),
            "completed": bool(entry.get("completed")), "partial": bool(entry.get("partial")), "turns": turns}


def write(run_path: Path, out: BinaryIO, to_chat: Callable[[dict], dict], keep: Callable[[dict], bool]) -> int:
    if not journal.batch_files(run_path):
        raise FileNotFoundError(f"{run_path} has no batch files: nothing was run yet")
    count = 0
    for entry in winners(run_path):
        if keep(entry):
            out.write((json.dumps(rl_record(entry, to_chat(entry)), ensure_ascii=False) + "\n").encode())
            count += 1
    return count
