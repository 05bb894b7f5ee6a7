"""Small helpers the end-to-end tests share: scripted prompts, dataset files, reading output."""
from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path


def script(*turns: dict) -> str:
    """A prompt line that makes the bundled model server answer exactly these turns (mockllm)."""
    return "MOCK_SCRIPT: " + json.dumps({"turns": list(turns)})


def write_dataset(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def tool_responses(entry: dict) -> list[dict]:
    """Every <tool_response> block of a trajectory entry, parsed, in order."""
    out = []
    for turn in entry["conversations"]:
        if turn["from"] == "tool":
            out += [json.loads(b) for b in re.findall(r"<tool_response>\n(.*?)\n</tool_response>", turn["value"], re.S)]
    return out


def until(predicate, what: str, timeout: float = 120.0, every: float = 0.2):
    """Poll until predicate() is truthy (a bound against hanging, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(every)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
