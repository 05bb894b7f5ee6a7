"""The terminal toolset: `terminal` (run a shell command) and `process` (background jobs,
hermes/tools/processes.py).

Everything runs inside the prompt's sandbox through `Sandbox.exec`, with POSIX sh and
busybox applets only (the default image has no bash and no python).
"""
from __future__ import annotations

from typing import Any

from hermes.tools._common import (
    FALLBACK_TIMEOUT_LIMIT,
    cd_prefix,
    dumps,
    error,
    fmt_seconds,
    in_sandbox,
    nocd,
    sandbox_timeout_limit,
)
from hermes.tools.processes import PROCESS_DESCRIPTION, PROCESS_PARAMETERS, run_process, start_background
from hermes.tools.registry import Tool, Toolset, register

TERMINAL_DESCRIPTION = (
    "Execute a shell command (POSIX sh) in this task's sandboxed Linux environment and return "
    "its output and exit code. Files persist between calls; each call starts a new shell, so "
    "`cd` and exported variables do not carry over (use `workdir`, or chain with &&). "
    "Prefer read_file / write_file / patch / search_files for file work. "
    "Foreground (default): returns as soon as the command finishes, or reports a time-out. "
    "Background (background=true): starts the command detached and returns a process_id; "
    "use the `process` tool to poll, read its log, wait for it or kill it. "
    "A non-zero exit_code is reported, not treated as a tool error."
)

TERMINAL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "The shell command to execute"},
        "background": {
            "type": "boolean",
            "description": "Run detached in the background and return a process_id (for servers and long jobs)",
            "default": False,
        },
        "timeout": {
            "type": "integer",
            "description": "Seconds to wait before the command is killed (foreground only; capped by the sandbox's limit)",
            "minimum": 1,
        },
        "workdir": {"type": "string", "description": "Working directory for this command (default: the task's working directory)"},
    },
    "required": ["command"],
}


# --------------------------------------------------------------------------- terminal

def _effective_timeout(sandbox: Any, requested: int | None) -> float | None:
    limit = sandbox_timeout_limit(sandbox)
    if requested is None:
        return None  # the sandbox's own default applies
    value = float(max(1, requested))
    return min(value, limit if limit is not None else FALLBACK_TIMEOUT_LIMIT)


def run_terminal(sandbox: Any, args: dict) -> str:
    command: str = args["command"]
    workdir = args.get("workdir")
    if not command.strip():
        return error("command is empty")
    if args.get("background"):
        return start_background(sandbox, command, workdir)

    timeout = _effective_timeout(sandbox, args.get("timeout"))
    result = sandbox.exec(cd_prefix(workdir) + command, timeout=timeout)
    if workdir and result.exit_code != 0 and nocd(result.output):
        return dumps({"output": "", "exit_code": 1, "error": f"Working directory not found: {workdir}"})

    payload: dict[str, Any] = {"output": result.output, "exit_code": result.exit_code, "error": None}
    if result.timed_out:
        waited = timeout if timeout is not None else sandbox_timeout_limit(sandbox)
        payload["error"] = (
            f"Command timed out after {fmt_seconds(waited)}s" if waited is not None else "Command timed out"
        )
    if result.truncated:
        payload["truncated"] = True
    return dumps(payload)


TOOLSET = register(Toolset(
    name="terminal", needs_sandbox=True, description="shell commands in the prompt's sandbox", tools=[
    Tool(name="terminal", description=TERMINAL_DESCRIPTION,
         parameters=TERMINAL_PARAMETERS, run=in_sandbox(run_terminal)),
    Tool(name="process", description=PROCESS_DESCRIPTION,
         parameters=PROCESS_PARAMETERS, run=in_sandbox(run_process)),
]))
