"""The reaper: one small process per owner process that removes the owner's runc sandboxes
when it dies, however it dies, and any sandbox past its deadline while it lives.

It reads a pipe only the owner writes to ("+ NAME DEADLINE" when a sandbox opens, "- NAME"
once the owner has removed it). The kernel closes that pipe when the owner dies, SIGKILL
included; the reaper then removes every sandbox still listed, at once, so a killed run's
sandboxes do not wait for their deadlines or for the next run's sweep (which stays the way for
a reaper that was itself killed). It lives in a session of its own, so a Ctrl-C of the run's
process group leaves it to finish.

One process per owner replaces one `sh -c 'sleep; runc delete'` per sandbox: two process
starts a sandbox (about 2 ms of CPU on this machine) and a kill at its close.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

log = logging.getLogger(__name__)

# Standard library only, run with -I: the reaper must not depend on where hermes is installed.
SCRIPT = r"""
import os, select, shutil, subprocess, sys, time
runc_root, boxes = sys.argv[1:3]
due = {}  # name -> when to remove it (seconds since the epoch); inf: only when the owner dies

def remove(name):
    try:
        subprocess.run(["runc", "--root", runc_root, "delete", "--force", name], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    except Exception:
        pass
    shutil.rmtree(os.path.join(boxes, name), ignore_errors=True)

rest = b""
while True:
    now = time.time()
    for name in [n for n, t in due.items() if t <= now]:
        del due[name]
        remove(name)
    wait = min(due.values(), default=float("inf")) - now
    ready, _, _ = select.select([0], [], [], None if wait == float("inf") else max(wait, 0.0))
    if not ready:
        continue
    chunk = os.read(0, 65536)
    if not chunk:
        break
    *lines, rest = (rest + chunk).split(b"\n")
    for line in lines:
        words = line.decode("utf-8", "replace").split()
        if len(words) == 3 and words[0] == "+":
            due[words[1]] = float(words[2])
        elif len(words) == 2 and words[0] == "-":
            due.pop(words[1], None)
for name in due:
    remove(name)
"""


class Reaper:
    """This process's reaper (see the module's text): `track` a sandbox when it opens, `forget`
    it once removed. A message that cannot be sent is dropped: the next run's sweep and
    `hermes-batch sandbox cleanup` still find what the reaper was not told of."""

    def __init__(self, runc_root: str, boxes: str):
        read_end, self._write_end = os.pipe()  # not inherited by runc or commands (close_fds)
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-c", SCRIPT, runc_root, boxes], stdin=read_end,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)
        # A reaper busy removing must not stall a prompt: what does not fit in the pipe is dropped.
        os.set_blocking(self._write_end, False)
        self._lock = threading.Lock()
        self._broken = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def track(self, name: str, deadline: float | None) -> None:
        """`name` opened: remove it at `deadline` (seconds since the epoch), or only if this process dies."""
        self._send(f"+ {name} {'inf' if deadline is None else f'{deadline:.3f}'}\n")

    def forget(self, name: str) -> None:
        self._send(f"- {name}\n")

    def _send(self, line: str) -> None:
        with self._lock:
            if self._broken:
                return
            try:
                os.write(self._write_end, line.encode())
            except BlockingIOError:
                log.warning("runc reaper %s is behind: %s not passed on", self.pid, line.strip())
            except OSError as e:  # it died: the next run's sweep removes what this process leaves
                self._broken = True
                log.warning("runc reaper %s is gone (%s): a crash of this process leaves its sandboxes "
                            "to the next run's start or `hermes-batch sandbox cleanup`", self.pid, e)


_reapers: dict[int, Reaper | None] = {}  # by pid: a forked child starts its own
_reapers_lock = threading.Lock()


def reaper(runc_root: str, boxes: str) -> Reaper | None:
    """This process's reaper, started at its first sandbox; None when it could not start."""
    with _reapers_lock:
        if os.getpid() not in _reapers:
            try:
                _reapers[os.getpid()] = Reaper(runc_root, boxes)
            except OSError as e:
                _reapers[os.getpid()] = None
                log.warning("cannot start the runc reaper (%s): a crash of this process leaves its sandboxes "
                            "to the next run's start or `hermes-batch sandbox cleanup`", e)
        return _reapers[os.getpid()]


def forget(name: str) -> None:
    """`name` is removed: this process's reaper, if it has one, lets it be."""
    found = _reapers.get(os.getpid())
    if found is not None:
        found.forget(name)
