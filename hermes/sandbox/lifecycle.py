"""When containers may exist, and who may remove them.

    owner_label() / owner_alive(owner, created)   which process made a container, and is it still alive
    stop_run(run_id) / stopping(run_id)           a run being interrupted makes no new containers
    RunGuard(run_id, cleanup).install()           SIGINT/SIGTERM remove the run's containers first

Every container carries `hermes-batch.owner=<hostname>:<pid>` of the process that made it. A
container whose owner is on this host and no longer alive belongs to a dead run: anyone may
remove it. Plain Python, no Prefect: a backend's guard_run installs a RunGuard as the run opens
(SandboxBackend.open_run); the generic parts here (owners, stopping runs) serve every backend.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from typing import Callable, Iterator

log = logging.getLogger(__name__)

#: run label of the container a run makes (never starts) to see which limits the engine applies
PROBE_RUN = "hermes-probe"
#: how long a signal handler waits for the run's containers to be removed before going on
STOP_TIMEOUT = 60.0


class RunInterrupted(BaseException):
    """The run is stopping (SIGINT/SIGTERM): this prompt must end now, unrecorded.

    A BaseException, like KeyboardInterrupt, so that the tool layer's catch-all (which turns
    errors into tool results for the model) lets it through and the prompt ends at once.
    """


# --------------------------------------------------------------------------- owners


def owner_label() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(owner: str | None, created: float | None = None) -> bool | None:
    """True/False for an owner on this host; None when it cannot be told (other host, no label).

    `created` (epoch seconds of the container) catches a reused pid: a process that started
    after the container was made cannot be the one that made it.
    """
    host, _, pid = (owner or "").rpartition(":")
    if not host or host != socket.gethostname() or not pid.isdigit():
        return None
    started = _process_start(int(pid))
    if started is None:
        return False
    return created is None or started <= created + 1.0


def _process_start(pid: int) -> float | None:
    """Epoch seconds a live process started; None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except FileNotFoundError:
        return None
    except OSError:
        return _start_without_proc(pid)
    fields = stat[stat.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
    if fields[0] in ("Z", "X"):
        return None
    return _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _start_without_proc(pid: int) -> float | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return 0.0  # alive, start unknown: never taken for a reused pid


_boot: float | None = None


def _boot_time() -> float:
    global _boot
    if _boot is None:
        with open("/proc/stat", encoding="ascii") as f:
            _boot = float(next(line.split()[1] for line in f if line.startswith("btime ")))
    return _boot


# --------------------------------------------------------------------------- stopping runs

_cond = threading.Condition()
_stopping: set[str] = set()
_creating: dict[str, int] = {}


def stopping(run_id: str) -> bool:
    return run_id in _stopping


def raise_if_stopping(run_id: str) -> None:
    if run_id in _stopping:
        raise RunInterrupted(f"run {run_id} is stopping")


def stop_run(run_id: str) -> None:
    _stopping.add(run_id)  # no lock: a signal handler calls this, maybe while its thread holds one


def resume_run(run_id: str) -> None:
    _stopping.discard(run_id)


@contextlib.contextmanager
def creating(run_id: str) -> Iterator[None]:
    """Bracket a container's creation, so a stopping run can wait until none is half made."""
    with _cond:
        _creating[run_id] = _creating.get(run_id, 0) + 1
    try:
        yield
    finally:
        with _cond:
            _creating[run_id] -= 1
            _cond.notify_all()


def wait_for_creations(run_id: str, timeout: float) -> bool:
    """After stop_run: every creation still under way sees the flag and removes its own container."""
    with _cond:
        return _cond.wait_for(lambda: not _creating.get(run_id), timeout)


# --------------------------------------------------------------------------- signals


class RunGuard:
    """While a run is open, SIGINT and SIGTERM first remove the run's containers.

    The first signal stops new containers, waits for those half made, removes the rest with
    `cleanup(run_id)`, then hands the signal to the handler that was there before (Python's
    KeyboardInterrupt, Prefect's termination handler, ...), so the run unwinds as it would have.
    A second signal forces: one more quick removal, then the process exits at once.
    Signal handlers can only be set from the main thread; elsewhere this guard does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, run_id: str, cleanup: Callable[[str], int], what: str = "containers"):
        self.run_id = run_id
        self.cleanup = cleanup
        self.what = what  # what cleanup removes, for the log (a Slurm run's guard cancels jobs)
        self._previous: dict[int, object] = {}
        self._signalled = False

    def install(self) -> "RunGuard":
        if threading.current_thread() is not threading.main_thread():
            log.debug("run %s: not the main thread, no signal handlers", self.run_id)
            return self
        for sig in self.SIGNALS:
            previous = signal.getsignal(sig)
            if previous is signal.SIG_IGN:
                continue  # this process is meant to survive the signal: leave its containers be
            self._previous[sig] = previous
            signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous)
        self._previous.clear()
        resume_run(self.run_id)

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self._signalled:
            log.warning("%s again: forcing run %s to stop now", name, self.run_id)
            self._remove(wait=False, timeout=10.0)
            os._exit(128 + signum)
        self._signalled = True
        log.warning("%s: stopping run %s, removing its %s (%s again forces)", name, self.run_id, self.what, name)
        self._remove(wait=True, timeout=STOP_TIMEOUT)
        self._pass_on(signum, frame)

    def _remove(self, wait: bool, timeout: float) -> None:
        # In a thread: the handler interrupts the main thread wherever it was, perhaps holding a
        # lock the removal needs; a bounded join can then never hang the process.
        stop_run(self.run_id)
        deadline = time.monotonic() + timeout

        def work() -> None:
            if wait:
                wait_for_creations(self.run_id, timeout / 2)
            try:
                removed = self.cleanup(self.run_id)
                log.warning("run %s: removed %d of its %s", self.run_id, removed, self.what)
            except Exception as e:  # noqa: BLE001 - the next run's start-up removes what is left
                log.warning("run %s: could not remove its %s: %s", self.run_id, self.what, e)

        worker = threading.Thread(target=work, name=f"stop-{self.run_id}", daemon=True)
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()))

    def _pass_on(self, signum: int, frame) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
