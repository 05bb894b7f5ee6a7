"""The process limits a sandbox container is asked for, runc's and gVisor's alike."""
from __future__ import annotations

from hermes.sandbox.base import SandboxSettings

#: host threads a gVisor sandbox's own kernel (its sentry and gofer) may use beyond pids_limit.
#: A fork bomb held by RLIMIT_NPROC at 64 processes still makes the sentry start ~2,400 host
#: threads in 6 s (measured on the 2-core test machine at load 10, runsc 20221219); at the cap the
#: sentry's Go runtime cannot start a thread and dies (the container exits 2, the prompt loses its
#: sandbox). 512 and 1,100 were reached within the abuse suite's 5 s command limit; 4,096 was not.
SENTRY_PIDS = 4096


def is_gvisor(runtime: str | None) -> bool:
    """gVisor's runtimes go by runsc (runsc, runsc-kvm, ...)."""
    return bool(runtime) and str(runtime).startswith("runsc")


def pids_limits(s: SandboxSettings) -> tuple[int, int | None]:
    """(the engine's pids limit, RLIMIT_NPROC or None) that hold the sandbox's processes to pids_limit.

    Under gVisor the engine's limit counts the host threads of the sandbox's own kernel, not the
    sandbox's processes (at 64 the kernel itself cannot start); the processes are held by
    RLIMIT_NPROC, which gVisor enforces per sandbox. Under runc the limit is the engine's alone:
    there RLIMIT_NPROC would count one uid's processes across every container of the host.
    """
    if is_gvisor(s.runtime):
        return s.pids_limit + SENTRY_PIDS, s.pids_limit
    return s.pids_limit, None
