"""Fresh signal dispositions and mask for a process this one starts, as `docker exec` gives.

A disposition of SIG_IGN and the signal mask survive fork and exec: a host process that ignores
SIGINT or SIGHUP (started under nohup, by a shell's background job, or by a supervisor that
ignores them) would hand that on to every sandbox the local and runc backends start, and a
program in the sandbox could not be interrupted as it could under Docker, whose exec starts
from the engine's defaults. Python's own SIG_IGN of SIGPIPE, SIGXFSZ and SIGXFZ is already
undone by subprocess (restore_signals), so nothing is done when only those are ignored: a
preexec_fn costs a full fork where subprocess would use vfork (the local backend starts a
process for every command).
"""
from __future__ import annotations

import functools
import signal
from typing import Any, Callable

#: what subprocess's restore_signals resets by itself
_RESTORED = {getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ", "SIGXFZ") if hasattr(signal, n)}
#: signals whose disposition cannot be changed, and glibc's own real-time ones (EINVAL)
_FIXED = {signal.SIGKILL, signal.SIGSTOP}


def ignored() -> set[int]:
    """Signals this process ignores (SigIgn of /proc/self/status), less those subprocess restores."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    mask = int(line.split()[1], 16)
                    return {n for n in range(1, 65) if mask >> (n - 1) & 1} - _RESTORED
    except (OSError, ValueError):
        pass
    return {s for s in signal.valid_signals() - _FIXED - _RESTORED
            if _safe_getsignal(s) is signal.SIG_IGN}


def _safe_getsignal(sig: int) -> Any:
    try:
        return signal.getsignal(sig)
    except (ValueError, OSError):
        return None


def _reset(ignored_now: frozenset[int]) -> None:
    """preexec_fn (after fork, before exec): the ignored signals back to SIG_DFL, nothing blocked.
    A caught signal needs nothing: exec resets it to SIG_DFL by itself."""
    for sig in ignored_now:
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (ValueError, OSError):  # glibc's own real-time signals (32, 33)
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def fresh_signals() -> dict[str, Callable[[], None]]:
    """Keyword arguments for subprocess.Popen: a preexec_fn when this process ignores a signal a
    child would inherit, or the calling thread blocks one; else none (vfork stays possible)."""
    found = frozenset(ignored())
    if not found and not signal.pthread_sigmask(signal.SIG_BLOCK, ()):
        return {}
    return {"preexec_fn": functools.partial(_reset, found)}
