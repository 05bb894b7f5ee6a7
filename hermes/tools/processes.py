"""The `process` tool: background jobs that terminal(background=true) started in a sandbox.

Tracked in the sandbox itself, one directory each under $TMPDIR/.hermes_procs/proc_N/
(/tmp/.hermes_procs in containers; files cmd, pid, log, exit, killed), so the tools keep no
state on the host side and any number of sandboxes can be used from one process.
"""
from __future__ import annotations

import re
from typing import Any

from hermes.tools._common import (
    FALLBACK_TIMEOUT_LIMIT,
    MARK,
    cd_prefix,
    dumps,
    error,
    marked_lines,
    nocd,
    q,
    sandbox_timeout_limit,
)

PROCS_DIR = "/tmp/.hermes_procs"
# In the sandbox's shell: /tmp/.hermes_procs in containers (TMPDIR=/tmp there); a local
# sandbox points TMPDIR at its own folder, so its processes never mix with another's.
_PROCS_SH = '"${TMPDIR:-/tmp}/.hermes_procs"'
_PROC_ID = re.compile(r"^proc_[0-9]{1,9}$")
# Seconds that every process-tool exec keeps in hand beyond its own waiting.
_EXEC_MARGIN = 10.0
POLL_TAIL_CHARS = 2000
LOG_DEFAULT_LINES = 200
LOG_MAX_LINES = 2000

PROCESS_DESCRIPTION = (
    "Manage background processes started with terminal(background=true) in this sandbox. "
    "Actions: 'list' (all processes), 'poll' (status, exit code and the latest output), "
    "'log' (output lines, paginated with offset/limit), 'wait' (block until it exits or the "
    "timeout passes), 'kill' (terminate it and its children)."
)

PROCESS_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {
            "type": "string",
            "enum": ["list", "poll", "log", "kill", "wait"],
            "description": "What to do",
        },
        "process_id": {
            "type": "string",
            "description": "The process id returned by terminal(background=true), e.g. 'proc_1'. Required for every action except 'list'.",
        },
        "timeout": {"type": "integer", "description": "Most seconds to block for 'wait'", "minimum": 1},
        "offset": {"type": "integer", "description": "'log': first line to return (1-based); default: the last `limit` lines", "minimum": 1},
        "limit": {"type": "integer", "description": "'log': most lines to return (default 200)", "minimum": 1},
    },
    "required": ["action"],
}


def start_background(sandbox: Any, command: str, workdir: str | None) -> str:
    # The wrapper is started with setsid (busybox and util-linux both have it) so that it
    # leads its own process group: `kill` then reaches the command and all its children,
    # and the sandbox's per-exec time limit does not. All descriptors go to files, so the
    # exec returns at once. The wrapper records its own pid ($$: right even when setsid
    # had to fork) and later the exit code, each atomically (tmp + mv); the launcher
    # waits for the pid file so the process is trackable when this call returns.
    # Not a shell background job (`cmd &`): those start with SIGINT and SIGQUIT ignored, for
    # good (issue 45). `setsid setsid`: the first makes itself a group leader, so the second
    # forks, its parent returning at once and its child detached in a session of its own.
    script = (
        cd_prefix(workdir)
        + f"""d={_PROCS_SH}
mkdir -p "$d" 2>/dev/null || {{ echo "{MARK} err cannot create $d"; exit 1; }}
n=1
while ! mkdir "$d/proc_$n" 2>/dev/null; do
  n=$((n+1))
  if [ "$n" -gt 100000 ]; then echo '{MARK} err cannot allocate a process id'; exit 1; fi
done
p="$d/proc_$n"
printf '%s' {q(command)} > "$p/cmd"
B='echo $$ >"$2/pid.tmp"; mv "$2/pid.tmp" "$2/pid"; sh -c "$1" >"$2/log" 2>&1 </dev/null; echo $? >"$2/exit.tmp"; mv "$2/exit.tmp" "$2/exit"'
b=
if command -v setsid >/dev/null 2>&1; then
  setsid setsid sh -c "$B" hermes-bg {q(command)} "$p" </dev/null >/dev/null 2>&1
else
  sh -c "$B" hermes-bg {q(command)} "$p" </dev/null >/dev/null 2>&1 &
  b=$!
fi
i=0
while [ ! -f "$p/pid" ] && [ "$i" -lt 200 ]; do sleep 0.02 2>/dev/null || sleep 1; i=$((i+1)); done
[ -f "$p/pid" ] || [ -z "$b" ] || echo "$b" > "$p/pid"
echo "{MARK} ok proc_$n $(cat "$p/pid") $p/log"
"""
    )
    limit = sandbox_timeout_limit(sandbox)
    result = sandbox.exec(script, timeout=min(30.0, limit) if limit else 30.0)
    if workdir and nocd(result.output):
        return dumps({"output": "", "exit_code": 1, "error": f"Working directory not found: {workdir}"})
    for line in marked_lines(result.output):
        parts = line.split(" ", 3)
        if parts[:1] == ["ok"] and len(parts) >= 2:
            return dumps({
                "output": "",
                "exit_code": 0,
                "error": None,
                "process_id": parts[1],
                "pid": int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None,
                "log_file": parts[3] if len(parts) > 3 else f"{PROCS_DIR}/{parts[1]}/log",
            })
        if parts[:1] == ["err"]:
            return error("Could not start background process: " + " ".join(parts[1:]))
    return error(f"Could not start background process: {result.output.strip()[:500] or 'no output'}")


# --------------------------------------------------------------------------- process

# Shell helpers shared by the process actions. `hs DIR` sets ST (running|exited|killed)
# and CODE (exit code or empty). A zombie (its parent, e.g. a container's PID 1, never
# reaped it) counts as exited, which `kill -0` alone would not tell.
_SH_HELPERS = f"""
alive() {{
  [ -n "$1" ] && kill -0 "$1" 2>/dev/null || return 1
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  case "${{s##*) }}" in Z*|X*) return 1;; esac
  return 0
}}
hs() {{
  CODE=; PID=$(cat "$1/pid" 2>/dev/null)
  if [ -f "$1/exit" ]; then ST=exited; CODE=$(cat "$1/exit" 2>/dev/null)
  elif [ -f "$1/killed" ]; then ST=killed; CODE=$(cat "$1/killed" 2>/dev/null)
  elif alive "$PID"; then ST=running
  elif [ -f "$1/exit" ]; then ST=exited; CODE=$(cat "$1/exit" 2>/dev/null)
  else ST=exited
  fi
}}
ms() {{ sleep 0.2 2>/dev/null || sleep 1; }}
d={_PROCS_SH}
"""


def _parse_code(text: str) -> int | None:
    text = (text or "").strip()
    try:
        return int(text)
    except ValueError:
        return None


def _status_fields(line: str) -> dict[str, Any]:
    """Parse 'status <ST> <CODE?>' into status/exit_code."""
    parts = line.split()
    status = parts[1] if len(parts) > 1 else "unknown"
    code = _parse_code(parts[2]) if len(parts) > 2 else None
    return {"status": status, "exit_code": code}


def _exec_process_script(sandbox: Any, body: str, wait: float = 0.0):
    limit = sandbox_timeout_limit(sandbox)
    timeout = wait + _EXEC_MARGIN
    if limit is not None:
        timeout = min(timeout, limit)
    return sandbox.exec(_SH_HELPERS + body, timeout=timeout)


def _after_marker(output: str, tag: str) -> str:
    """The text printed after the line '<MARK> <tag>' (to the end of the output)."""
    key = f"{MARK} {tag}\n"
    idx = output.find(key)
    return "" if idx == -1 else output[idx + len(key):]


def _list(sandbox: Any) -> str:
    body = f"""
for p in "$d"/proc_*; do
  [ -d "$p" ] || continue
  hs "$p"
  printf '%s\\037%s\\037%s\\037%s\\037' "${{p##*/}}" "$PID" "$ST" "$CODE"
  head -c 200 "$p/cmd" 2>/dev/null
  printf '\\036'
done
echo
echo "{MARK} done"
"""
    result = _exec_process_script(sandbox, body)
    if f"{MARK} done" not in result.output:
        return error(f"Could not list processes: {result.output.strip()[:500]}")
    procs = []
    for record in result.output.split("\x1e"):
        fields = record.lstrip("\n").split("\x1f", 4)
        if len(fields) != 5 or not _PROC_ID.match(fields[0]):
            continue
        pid, status, code, cmd = fields[1], fields[2], fields[3], fields[4]
        procs.append({
            "process_id": fields[0],
            "pid": int(pid) if pid.isdigit() else None,
            "status": status,
            "exit_code": _parse_code(code),
            "command": cmd,
        })
    procs.sort(key=lambda p: int(p["process_id"].split("_")[1]))
    return dumps({"processes": procs, "total": len(procs)})


def _known(pid: str) -> str:
    """Script prelude: select the process dir, or report it unknown."""
    return f"""p="$d"/{q(pid)}
if [ ! -d "$p" ]; then echo "{MARK} unknown"; exit 0; fi
"""


def _tail_script(chars: int) -> str:
    return f"""echo "{MARK} output"
tail -c {int(chars)} "$p/log" 2>/dev/null
"""


def _poll(sandbox: Any, pid: str) -> str:
    body = _known(pid) + f"""hs "$p"
echo "{MARK} status $ST $CODE"
echo "{MARK} cmd $(head -c 200 "$p/cmd" 2>/dev/null | tr '\\n' ' ')"
""" + _tail_script(POLL_TAIL_CHARS)
    result = _exec_process_script(sandbox, body)
    return _status_result(pid, result.output)


def _status_result(pid: str, output: str, **extra: Any) -> str:
    lines = marked_lines(output)
    if "unknown" in lines:
        return error(f"Unknown process_id: {pid}")
    status = next((l for l in lines if l.startswith("status ")), None)
    if status is None:
        return error(f"Could not read process {pid}: {output.strip()[:500]}")
    payload: dict[str, Any] = {"process_id": pid, **_status_fields(status)}
    cmd = next((l for l in lines if l.startswith("cmd ")), None)
    if cmd is not None:
        payload["command"] = cmd[4:]
    payload["output"] = _after_marker(output, "output")
    payload.update(extra)
    payload["error"] = None
    return dumps(payload)


def _log(sandbox: Any, pid: str, offset: int | None, limit: int | None) -> str:
    n = max(1, min(int(limit or LOG_DEFAULT_LINES), LOG_MAX_LINES))
    if offset is not None:
        start = max(1, int(offset))
        select = f"sed -n '{start},{start + n - 1}p' \"$p/log\" 2>/dev/null"
    else:
        select = f"tail -n {n} \"$p/log\" 2>/dev/null"
    body = _known(pid) + f"""hs "$p"
echo "{MARK} status $ST $CODE"
echo "{MARK} lines $(wc -l < "$p/log" 2>/dev/null || echo 0)"
echo "{MARK} output"
{select}
"""
    result = _exec_process_script(sandbox, body)
    lines = marked_lines(result.output)
    total = next((l for l in lines if l.startswith("lines ")), "lines 0").split()
    total_lines = int(total[1]) if len(total) > 1 and total[1].isdigit() else None
    return _status_result(pid, result.output, total_lines=total_lines)


def _wait(sandbox: Any, pid: str, timeout: int | None) -> str:
    limit = sandbox_timeout_limit(sandbox)
    longest = max(1.0, (limit if limit is not None else FALLBACK_TIMEOUT_LIMIT) - _EXEC_MARGIN)
    wait_for = min(float(timeout) if timeout is not None else longest, longest)
    wait_for = max(1.0, wait_for)
    body = _known(pid) + f"""end=$(( $(date +%s) + {int(wait_for)} ))
hs "$p"
while [ "$ST" = running ] && [ "$(date +%s)" -lt "$end" ]; do ms; hs "$p"; done
echo "{MARK} status $ST $CODE"
""" + _tail_script(POLL_TAIL_CHARS)
    result = _exec_process_script(sandbox, body, wait=wait_for)
    lines = marked_lines(result.output)
    status = next((l for l in lines if l.startswith("status ")), None)
    still_running = status is not None and _status_fields(status)["status"] == "running"
    return _status_result(pid, result.output, timed_out=still_running)


def _kill(sandbox: Any, pid: str) -> str:
    body = _known(pid) + f"""hs "$p"
if [ "$ST" != running ]; then echo "{MARK} status $ST $CODE"; echo "{MARK} was $ST"; exit 0; fi
echo 143 > "$p/killed"
kill -TERM -"$PID" 2>/dev/null || kill -TERM "$PID" 2>/dev/null
i=0
while alive "$PID" && [ $i -lt 15 ]; do ms; i=$((i+1)); done
if alive "$PID"; then
  kill -KILL -"$PID" 2>/dev/null || kill -KILL "$PID" 2>/dev/null
  echo 137 > "$p/killed"
fi
hs "$p"
echo "{MARK} status $ST $CODE"
echo "{MARK} was running"
""" + _tail_script(POLL_TAIL_CHARS)
    result = _exec_process_script(sandbox, body, wait=8.0)
    lines = marked_lines(result.output)
    was = next((l for l in lines if l.startswith("was ")), "was unknown")[4:]
    if was == "running":
        return _status_result(pid, result.output, killed=True)
    return _status_result(pid, result.output, killed=False, note=f"process was not running ({was})")


def stop_background_processes(sandbox: Any) -> int:
    """Kill every background process started in this sandbox (whole process groups).

    A container's removal does this anyway; a host-side sandbox (LocalSandbox) does not,
    because the processes run in sessions of their own. Returns how many were running.
    Never raises."""
    body = f"""k=0
for p in "$d"/proc_*; do
  [ -d "$p" ] || continue
  hs "$p"
  [ "$ST" = running ] || continue
  echo 137 > "$p/killed"
  kill -KILL -"$PID" 2>/dev/null || kill -KILL "$PID" 2>/dev/null
  k=$((k+1))
done
echo "{MARK} stopped $k"
"""
    try:
        result = _exec_process_script(sandbox, body)
    except Exception:
        return 0
    for line in marked_lines(result.output):
        if line.startswith("stopped ") and line.split()[-1].isdigit():
            return int(line.split()[-1])
    return 0


def run_process(sandbox: Any, args: dict) -> str:
    action = args["action"]
    if action == "list":
        return _list(sandbox)
    pid = args.get("process_id") or args.get("session_id")  # session_id: hermes-agent's name
    if not pid:
        return error(f"Missing required parameter 'process_id' for action '{action}'")
    if not isinstance(pid, str) or not _PROC_ID.match(pid):
        return error(f"Invalid process_id: {str(pid)[:100]!r} (expected e.g. 'proc_1')")
    if action == "poll":
        return _poll(sandbox, pid)
    if action == "log":
        return _log(sandbox, pid, args.get("offset"), args.get("limit"))
    if action == "wait":
        return _wait(sandbox, pid, args.get("timeout"))
    if action == "kill":
        return _kill(sandbox, pid)
    return error(f"Unknown action: {action}")  # unreachable: the schema's enum is checked first
