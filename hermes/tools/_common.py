"""Small helpers shared by the tool modules (no tool lives here)."""
from __future__ import annotations

import json
import shlex
from typing import Any

# Marker that tool scripts print before machine-readable lines, so that stray stderr
# from the sandbox (interleaved with stdout) can never be mistaken for data.
MARK = "__HERMES_7f3a__"

# Foreground commands never wait longer than this, whatever the model asks for,
# when the sandbox does not advertise a limit of its own.
FALLBACK_TIMEOUT_LIMIT = 600.0


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def error(message: str, **extra: Any) -> str:
    return dumps({"error": message, **extra})


def q(value: Any) -> str:
    """Shell-quote one model-supplied value. Every user value goes through here."""
    return shlex.quote(str(value))


def sandbox_timeout_limit(sandbox: Any) -> float | None:
    """The sandbox's per-command time limit in seconds, when it says what it is."""
    value = getattr(sandbox, "command_timeout", None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def fmt_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def marked_lines(output: str) -> list[str]:
    """The payload of every line the script printed behind MARK (in order)."""
    out = []
    for line in output.splitlines():
        idx = line.find(MARK)
        if idx != -1:
            out.append(line[idx + len(MARK):].lstrip(" "))
    return out


def unmarked(output: str) -> str:
    """Everything the script printed that is not a MARK line (usually stderr noise)."""
    return "\n".join(line for line in output.splitlines() if MARK not in line).strip()


def in_sandbox(fn):
    """Adapt a tool written against the prompt's sandbox, run(sandbox, args), to run(ctx, args)."""
    def run(ctx: Any, args: dict) -> Any:
        return fn(ctx.sandbox, args)

    run.__name__ = getattr(fn, "__name__", "run")
    run.__wrapped__ = fn
    return run


def cd_prefix(workdir: str | None) -> str:
    """A first script line that enters `workdir`, or reports (behind MARK) that it cannot."""
    if workdir is None or workdir == "":
        return ""
    return f"cd -- {q(workdir)} 2>/dev/null || {{ echo '{MARK} nocd'; exit 1; }}\n"


def nocd(output: str) -> bool:
    first = output.lstrip().split("\n", 1)[0]
    return first.strip() == f"{MARK} nocd"
