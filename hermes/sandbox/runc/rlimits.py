"""The resource limits (`ulimit -a`) a runc sandbox's processes start with: a Docker container's.

The Docker engine writes no rlimit into a container's spec unless asked (`--ulimit`, the
daemon's default-ulimits): a container's processes inherit containerd's, through its shim and
runc, and `docker exec` shows those. `runc spec` instead writes RLIMIT_NOFILE 1024, which a
program that opens many files (a build, a test runner, a database) would hit under the runc
backend and not under Docker. So the spec gets every limit of the engine's running containerd
(root, which the runc backend needs, can read its /proc/PID/limits), or, with no containerd
found, of this process, which is what runc itself would pass on with none in the spec.
"""
from __future__ import annotations

import functools
import resource
from pathlib import Path

#: /proc/PID/limits row names -> the OCI spec's rlimit types
NAMES = {
    "Max cpu time": "RLIMIT_CPU", "Max file size": "RLIMIT_FSIZE", "Max data size": "RLIMIT_DATA",
    "Max stack size": "RLIMIT_STACK", "Max core file size": "RLIMIT_CORE", "Max resident set": "RLIMIT_RSS",
    "Max processes": "RLIMIT_NPROC", "Max open files": "RLIMIT_NOFILE", "Max locked memory": "RLIMIT_MEMLOCK",
    "Max address space": "RLIMIT_AS", "Max file locks": "RLIMIT_LOCKS", "Max pending signals": "RLIMIT_SIGPENDING",
    "Max msgqueue size": "RLIMIT_MSGQUEUE", "Max nice priority": "RLIMIT_NICE",
    "Max realtime priority": "RLIMIT_RTPRIO", "Max realtime timeout": "RLIMIT_RTTIME",
}
#: RLIM_INFINITY as the spec's uint64 writes it
UNLIMITED = (1 << 64) - 1


def parse_limits(text: str) -> list[dict]:
    """The rows of a /proc/PID/limits text as the spec's rlimits entries."""
    out = []
    for line in text.splitlines()[1:]:
        for name, kind in NAMES.items():
            if line.startswith(name + " "):
                soft, hard = line[len(name):].split()[:2]
                out.append({"type": kind, "soft": _value(soft), "hard": _value(hard)})
    return out


def _value(word: str) -> int:
    return UNLIMITED if word == "unlimited" else int(word)


def _engine_containerd() -> Path | None:
    """/proc/PID of the containerd the Docker engine runs its containers with (one whose command
    line names docker, else any containerd)."""
    found: list[tuple[bool, Path]] = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "comm").read_text().strip() != "containerd":
                continue
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        found.append((b"docker" in cmdline, proc))
    return max(found, key=lambda f: f[0])[1] if found else None


def _own() -> list[dict]:
    out = []
    for kind in NAMES.values():
        number = getattr(resource, kind, None)
        if number is None:
            continue
        soft, hard = resource.getrlimit(number)
        out.append({"type": kind, "soft": UNLIMITED if soft == resource.RLIM_INFINITY else soft,
                    "hard": UNLIMITED if hard == resource.RLIM_INFINITY else hard})
    return out


@functools.lru_cache(maxsize=1)
def docker_rlimits() -> tuple[dict, ...]:
    """The limits a Docker container's process starts with on this host (read once per process)."""
    proc = _engine_containerd()
    if proc is not None:
        try:
            rows = parse_limits((proc / "limits").read_text())
        except OSError:
            rows = []
        if rows:
            return tuple(rows)
    return tuple(_own())
