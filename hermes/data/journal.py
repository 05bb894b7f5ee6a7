"""The batch files are the run's journal: one JSON line per finished prompt, durable at once.

Everything else in a run folder is derived from these lines and can be rebuilt from them.
"""
from __future__ import annotations

import json
import os
import threading
import weakref
from pathlib import Path
from typing import Any, Iterable, Iterator

from hermes.data.run_paths import RunPaths


class _SyncState:
    """Appends to one file, and how many of them are known to be on disk."""

    def __init__(self) -> None:
        self.write_lock = threading.Lock()
        self.sync_lock = threading.Lock()
        self.written = 0
        self.synced = 0


# A file's state lives while an append holds it: a run writes tens of thousands of batch files and
# kept one state each for its whole length (about 1 KB a batch). Appends that overlap share one state,
# which is all group commit needs; an append that finds none starts afresh and syncs its own line.
_files: weakref.WeakValueDictionary[str, _SyncState] = weakref.WeakValueDictionary()
_files_guard = threading.Lock()


def _state_for(path: Path) -> _SyncState:
    with _files_guard:
        state = _files.get(str(path))
        if state is None:
            state = _files[str(path)] = _SyncState()
    return state


def append(path: Path, entry: dict[str, Any]) -> None:
    """Append one line; return only once it is on disk: a finished prompt is never lost.

    Group commit: prompts finishing together share one fsync. Whoever syncs first covers
    every line written before its fsync began; the others find theirs covered and return.
    """
    data = encode(entry)
    state = _state_for(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        with state.write_lock:
            _write_all(fd, data)
            state.written += 1
            mine = state.written
        with state.sync_lock:
            if state.synced < mine:
                covered = state.written  # every append counted here has finished its write
                os.fsync(fd)  # syncs the file, whichever descriptor wrote the lines
                state.synced = covered
    finally:
        os.close(fd)


def seal(path: Path) -> None:
    """End a torn last line (a writer killed mid-line) with a newline before appending after it.

    Readers skip the sealed fragment as an unreadable line; without this, the next append would
    be glued to it and lost with it. Only the one writer of a batch file at a time calls this.
    """
    try:
        with open(path, "rb+") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.seek(0, os.SEEK_END)
                f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())
    except FileNotFoundError:
        pass


def encode(entry: dict[str, Any]) -> bytes:
    """One journal line: the entry's keys in its own order (hermes.data.entry.JournalEntry.record()
    keeps the order hermes.data.run_index slices lines by), UTF-8 as is, one newline."""
    return (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def batch_files(run_dir: Path) -> list[tuple[int, Path]]:
    return RunPaths(run_dir).batch_files()


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


def write_atomic(path: Path, text: str | Iterable[str]) -> None:
    """Derived files are written to a temporary name, synced, and renamed into place; `text` may
    come in pieces, so that a big file is never one string."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines([text] if isinstance(text, str) else text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
