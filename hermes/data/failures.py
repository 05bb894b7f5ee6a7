"""What kind of failure a prompt's error is, and whether trying it again can help.

One classification serves the run (which failed attempts are put back in the queue,
hermes.run.requeue) and its reports (statistics.json and `hermes-batch status` group failures by
kind, with a count and an example message). It reads what the journal keeps, not an exception, so
that journals of earlier runs and other processes are grouped the same way: the kind the error
said it was (hermes.errors: an entry's `error_kind` and `error_transient`) where the entry has one,
else its text, this package's own (hermes.model.client, hermes.sandbox) matched by fixed prefixes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Union

from hermes.errors import HermesError

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
    ("setup command", "row setup failed", False),           # the row's own setup (hermes.data.task): its output says why
    ("the prompt did not finish within its time limit", "prompt deadline", False),  # --prompt_timeout
)
_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


def status_failure(status: int) -> Failure:
    """The kind of a model endpoint's error status, and whether asking again can help."""
    return Failure(f"model endpoint {status}", status in TRANSIENT_STATUSES or status >= 500)


def of_exception(e: BaseException | None) -> Failure | None:
    """What the exception says it is (hermes.errors), or None where it does not say (grouped by text)."""
    if isinstance(e, HermesError) and e.kind:
        return Failure(e.kind, bool(e.transient))
    return None


def classify(error: str | None, kind: str | None = None, transient: bool | None = None) -> Failure:
    """The failure of an entry: its recorded kind when it has one, else what its text says."""
    if kind:
        return Failure(kind, bool(transient))
    line = (error or "").strip().splitlines()[0] if (error or "").strip() else ""
    if not line:
        return Failure("unknown error", False)
    m = _STATUS.match(line)
    if m:
        return status_failure(int(m.group(1)))
    for prefix, kind, transient in _PREFIXES:
        if line.startswith(prefix):
            return Failure(kind, transient)
    # Anything else is grouped by its text with the numbers taken out (ids, sizes, seconds vary).
    return Failure(_NUMBERS.sub("N", line)[:120], False)


#: an error's text, or (text, recorded kind) where the entry has one
Recorded = Union[str, None, tuple[Union[str, None], Union[str, None]]]


def group(errors: Iterable[Recorded]) -> dict[str, dict[str, Any]]:
    """{kind: {"count", "example"}} of failure messages, the most frequent kind first."""
    kinds: dict[str, dict[str, Any]] = {}
    for item in errors:
        error, recorded = item if isinstance(item, tuple) else (item, None)
        kind = classify(error, recorded).kind
        slot = kinds.setdefault(kind, {"count": 0, "example": (error or "unknown error").strip()[:EXAMPLE_CHARS]})
        slot["count"] += 1
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]["count"]))
