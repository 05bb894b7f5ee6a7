"""The batch files are the run's journal: one JSON line per finished prompt, durable at once.

Everything else in a run folder is derived from these lines and can be rebuilt from them.
"""
from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any, Iterator

BATCH_RE = re.compile(r"^batch_(\d+)\.jsonl$")
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(path: Path) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(str(path.resolve()), threading.Lock())


def append(path: Path, entry: dict[str, Any]) -> None:
    """Append one line, flushed and fsync'ed before returning: a finished prompt is never lost."""
    line = json.dumps(entry, ensure_ascii=False) + "\n"
    with _lock_for(path):
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def batch_files(run_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for p in run_dir.glob("batch_*.jsonl"):
        m = BATCH_RE.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def read(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the entries of one batch file; a torn line (a crash mid-write) is skipped."""
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # the last line of a crashed write
            try:
                yield json.loads(raw)
            except ValueError:
                continue


def write_atomic(path: Path, text: str) -> None:
    """Derived files are written to a temporary name, synced, and renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
