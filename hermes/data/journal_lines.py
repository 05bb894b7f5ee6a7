"""Reading the journal's lines cheaply: every complete line with its number, and an entry cut
into its trajectory and the small tail the run index needs, decoding as little as possible.

The run index, the merge and the live progress all read batch files through these.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

from pydantic_core import from_json

from hermes.data.entry import TAIL_KEYS

# The byte-slicing contract with the entry's key order (hermes/data/entry.py: JournalEntry and
# TAIL_KEYS, written by hermes.data.journal.encode): a runner's line ends with the keys TAIL_KEYS, in
# that order, `hermes` (an object) last. Cut at _HERMES, a line is its trajectory; from _TAIL on,
# it is the small tail the index decodes. tests/data/test_entry.py fails if the model breaks it.
_HERMES = f', "{TAIL_KEYS[-1]}": {{'.encode()
_TAIL = f', "{TAIL_KEYS[0]}": '.encode()


def journal_lines(path: Path, size: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number from 0, raw line) of each complete line in the first `size` bytes.

    A torn last line (a crash mid-write) is left out, as by hermes.data.journal.read.
    """
    # A buffer the file's size (up to 1 MiB): a 1 MiB buffer for each 50 KB batch file cost the
    # allocator 4 GB over a 20,000-prompt run and left the heap fragmented (bench/INFLIGHT_MEMORY.md).
    known = os.stat(path).st_size if size is None else size
    with open(path, "rb", buffering=max(8192, min(1 << 20, known + 1))) as f:
        read = 0
        for n, raw in enumerate(f):
            read += len(raw)
            if not raw.endswith(b"\n") or (size is not None and read > size):
                return
            yield n, raw


def split_entry(raw: bytes) -> tuple[bytes | None, dict] | None:
    """(the line without its `hermes` block, the entry's last fields), decoding as little as possible.

    The runner writes `api_calls`, `toolsets_used`, `tool_stats`, `tool_error_counts` and then
    `hermes` as an entry's last keys (hermes.data.entry.TAIL_KEYS, the contract above _HERMES): such a line is decoded from `, "api_calls": ` on (a tenth
    of a 9 KB trajectory) and the line without `hermes` is the line cut at `, "hermes": {`,
    never re-encoded. Any other line is decoded whole: then the head is None and the tail is
    the whole entry. None: the line is not a JSON object (skipped, as by hermes.data.journal.read).
    """
    if raw.endswith(b"}}\n"):
        cut = raw.rfind(_HERMES)
        start = raw.rfind(_TAIL, 0, cut) if cut > 0 else -1
        if start > 0:
            try:
                # Both parse only if the cut points are keys of the top-level object: text after a
                # nested key would close one object too many (and a JSON string cannot hold `, "`).
                tail = from_json(b"{" + raw[start + 2:])
                from_json(raw[cut + len(_HERMES) - 1:-2])
            except ValueError:
                pass
            else:
                return raw[:cut] + b"}\n", tail
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    return (None, entry) if isinstance(entry, dict) else None


def outcome_block(raw: bytes) -> dict | None:
    """The hermes block of a journal line (the index needs nothing else): for a line of the
    runner's shape only that block is decoded; None when the line is not a JSON object."""
    if raw.endswith(b"}}\n"):
        cut = raw.rfind(_HERMES)
        if cut > 0:
            try:
                # parses alone only if it is the top-level object's last value (see split_entry)
                return from_json(raw[cut + len(_HERMES) - 1:-2])
            except ValueError:
                pass
    parsed = split_entry(raw)
    return None if parsed is None else hermes_block(parsed[1])


_REWARD = b'"reward": {'


def verdict(raw: bytes) -> bool | None:
    """Whether the line's check passed (its `reward.passed`); None: the line has no check. Only
    lines that hold a reward are decoded (their tail, split_entry), so plain rows cost a byte search."""
    if _REWARD not in raw:
        return None
    parsed = split_entry(raw)
    reward = parsed[1].get("reward") if parsed else None
    return bool(reward.get("passed")) if isinstance(reward, dict) else None


def hermes_block(tail: dict) -> dict:
    meta = tail.get("hermes")
    return meta if isinstance(meta, dict) else {}
