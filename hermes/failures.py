"""What kind of failure a prompt's error is, and whether trying it again can help.

One classification serves the run (which failed attempts are put back in the queue,
hermes.requeue) and its reports (statistics.json and `hermes-batch status` group failures by
kind, with a count and an example message). It reads the error text the journal keeps, not an
exception, so that journals of earlier runs and other processes are grouped the same way; the
texts are this package's own (hermes.model, hermes.sandbox), matched by their fixed prefixes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

# statuses after which a repeat can succeed: time-out, conflict, too early, rate limit, server side
TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})
EXAMPLE_CHARS = 300


@dataclass(frozen=True)
class Failure:
    kind: str        # e.g. "model endpoint 429", "engine time-out", "image unavailable"
    transient: bool  # the same prompt may well succeed if tried again later


_STATUS = re.compile(r"^model endpoint answered (\d{3})\b")
#: (prefix of the error's first line, kind, transient), first match wins
_PREFIXES: tuple[tuple[str, str, bool], ...] = (
    ("model endpoint failed: Request timed out", "model endpoint time-out", True),
    ("model endpoint failed: Connection error", "model endpoint connection failed", True),
    ("model endpoint failed", "model endpoint failed", True),
    ("model endpoint answered something that is not JSON", "model endpoint non-JSON answer", True),
    ("model endpoint", "model endpoint unusable answer", False),  # no choices, malformed tool call or stream
    ("Docker engine too slow", "engine time-out", True),
    ("no Docker engine answers", "engine unreachable", True),
    ("Docker engine connection failed", "engine connection failed", True),
    ("image not available", "image unavailable", False),
    ("cannot create a container", "sandbox setup failed", False),
    ("cannot start a container", "sandbox setup failed", False),
    ("sandbox container", "sandbox lost", False),
    ("sandbox command channel", "sandbox lost", False),
    ("setup command", "row setup failed", False),           # the row's own setup (hermes.task): its output says why
    ("the prompt did not finish within its time limit", "prompt deadline", False),  # --prompt_timeout
)
_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


def classify(error: str | None) -> Failure:
    line = (error or "").strip().splitlines()[0] if (error or "").strip() else ""
    if not line:
        return Failure("unknown error", False)
    m = _STATUS.match(line)
    if m:
        status = int(m.group(1))
        return Failure(f"model endpoint {status}", status in TRANSIENT_STATUSES or status >= 500)
    for prefix, kind, transient in _PREFIXES:
        if line.startswith(prefix):
            return Failure(kind, transient)
    # Anything else is grouped by its text with the numbers taken out (ids, sizes, seconds vary).
    return Failure(_NUMBERS.sub("N", line)[:120], False)


def group(errors: Iterable[str | None]) -> dict[str, dict[str, Any]]:
    """{kind: {"count", "example"}} of failure messages, the most frequent kind first."""
    kinds: dict[str, dict[str, Any]] = {}
    for error in errors:
        kind = classify(error).kind
        slot = kinds.setdefault(kind, {"count": 0, "example": (error or "unknown error").strip()[:EXAMPLE_CHARS]})
        slot["count"] += 1
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]["count"]))
