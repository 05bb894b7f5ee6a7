"""Reading one command's output from its exec stream, and what the command's end says.

A command runs under the exec wrapper (channel.WRAPPER): its output, then an end marker
carrying its exit code and the timer's status; a process-group tag on the control stream
names what to kill when its output floods or its time runs out.
"""
from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass
from typing import Callable

from hermes.sandbox.base import ExecResult, OutputCap
from hermes.sandbox.docker.channel import Frames


@dataclass
class Outcome:
    """How reading one command's output ended."""

    end: tuple[int, int] | None = None  # (exit code, timer status) from the end marker
    target: str | None = None           # "-PGID" or "PID" to kill it by
    host_timed_out: bool = False
    flood_killed: bool = False
    broke: bool | OSError = False       # the stream ended (or failed: the error) before the end marker
    stale: int = 0                      # bytes of earlier commands' background jobs dropped
    begun: bool = True                  # on a channel: its start marker seen, so the command ran


def read_output(frames: Frames, nonce: str, deadline: float, cap: OutputCap, begin: bytes | None, *,
                kill: Callable[[str], None], raise_if_dead: Callable[[], None]) -> Outcome:
    """Feed one command's output to `cap` until its end marker. On a channel, `begin` is the
    request's start marker: output before it is late output of earlier commands' background jobs."""
    out = Outcome(begun=begin is None)
    prefix = b"\n" + nonce.encode() + b" "
    tag = re.compile(re.escape(nonce.encode()) + rb" (pgid|pid) (\d+)")
    pending, control = bytearray(), bytearray()
    while out.end is None:
        try:
            frame = frames.next(deadline)
        except (socket.timeout, TimeoutError):
            out.host_timed_out = True
            break
        except OSError as e:
            out.broke = e
            break
        if frame is None:
            out.broke = True
            break
        stream, payload = frame
        if stream == 2:
            if out.target is None:
                control = (control + payload)[-4096:]
                m = tag.search(control)
                if m:
                    out.target = ("-" if m.group(1) == b"pgid" else "") + m.group(2).decode()
            continue
        pending += payload
        if begin is not None:
            at = pending.find(begin)
            if at < 0:
                drop = max(0, len(pending) - len(begin))
                out.stale += drop
                del pending[:drop]
                continue
            out.stale += at
            del pending[:at + len(begin)]
            begin, out.begun = None, True
        at = pending.find(prefix)
        if at >= 0:
            nl = pending.find(b"\n", at + len(prefix))
            if nl >= 0:
                parts = pending[at + len(prefix):nl].split()
                try:
                    out.end = (int(parts[0]), int(parts[1]))
                except (IndexError, ValueError):
                    out.end = (-1, 1)
            cap.feed(bytes(pending[:at]))
            del pending[:at]
        elif len(pending) > len(prefix) + 32:
            cut = len(pending) - (len(prefix) + 32)
            cap.feed(bytes(pending[:cut]))
            del pending[:cut]
        if cap.flooded and not out.flood_killed and out.target:
            out.flood_killed = True
            kill(out.target)
    if out.end is None:
        if begin is None:
            cap.feed(bytes(pending))
        if not out.host_timed_out:
            raise_if_dead()
        elif out.target:
            kill(out.target)
    return out


def finish(out: Outcome, cap: OutputCap, limit: float, started: float, *, exit_code_of: Callable[[], int],
           why_killed: Callable[[], str]) -> ExecResult:
    """The ExecResult of a command whose output was read: its exit code, whether its time limit
    or its output flood killed it, and why a SIGKILLed one died (`why_killed`)."""
    text, truncated = cap.result()
    if out.flood_killed:
        text += f"\n[command killed: it kept writing output ({cap.total} bytes)]"
    if out.end is not None:
        code, fired = out.end
        # The timer's kill succeeded and the command died of it. The timer's own status is lost
        # when the wrapper reaps it a moment after it fired: then the clock says so.
        timed_out = code >= 128 and (fired == 0 or time.monotonic() - started >= limit)
        exit_code = -1 if (timed_out or out.flood_killed) else code
    elif out.host_timed_out:
        timed_out, exit_code = True, -1
    else:  # the wrapper (or the channel's shell) itself died, e.g. out of memory; ask the engine
        timed_out, exit_code = False, exit_code_of()
        if exit_code == 0:
            exit_code = -1
    if exit_code == 137 and not timed_out:
        text += ("" if text.endswith("\n") or not text else "\n") + why_killed()
    return ExecResult(exit_code=exit_code, output=text, timed_out=timed_out, truncated=truncated,
                      duration=time.monotonic() - started)
