"""Few-shot messages put before a prompt (--prefill_messages_file): used while running, never saved."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load_prefill(path: str | None) -> list[dict[str, Any]]:
    if not path:
        return []
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"--prefill_messages_file {path}: {e}") from e
    if not isinstance(data, list) or not all(isinstance(m, dict) and "role" in m for m in data):
        raise ValueError(f"--prefill_messages_file {path}: expected a JSON array of messages with a 'role'")
    return data
