"""A small real sandbox for tests: `sh -c` in a private temp directory on this host.

Not a mock: commands really run in a shell. It implements the Sandbox protocol of
hermes/sandbox/base.py the simplest honest way, for tests that must not depend on the
production backends being finished.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile

from hermes.sandbox.base import ExecResult


def busybox_bin() -> str | None:
    """A directory holding only busybox applets (like the sandbox image), or None."""
    busybox = shutil.which("busybox")
    if busybox is None:
        return None
    target = os.path.join(tempfile.gettempdir(), f"hermes-busybox-bin-{os.getuid()}")
    if not os.path.exists(os.path.join(target, "sh")):
        os.makedirs(target, exist_ok=True)
        applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
        for applet in applets:
            link = os.path.join(target, applet)
            if not os.path.lexists(link):
                os.symlink(busybox, link)
    return target


class ShellBox:
    """`busybox=True` runs busybox sh with a PATH of busybox applets only (no GNU tools,
    no bash, no python), the way the default sandbox image does."""

    def __init__(self, command_timeout: float = 20.0, output_limit: int = 50_000, busybox: bool = False):
        self.root = tempfile.mkdtemp(prefix="hermes-shellbox-")
        self.command_timeout = command_timeout
        self.output_limit = output_limit
        self.env = None
        self.shell = "sh"
        if busybox:
            bindir = busybox_bin()
            if bindir is None:
                raise RuntimeError("busybox is not installed")
            self.shell = os.path.join(bindir, "sh")
            self.env = {"PATH": bindir, "HOME": self.root, "LANG": "C.UTF-8"}

    def _abs(self, path: str) -> str:
        return path if os.path.isabs(path) else os.path.join(self.root, path)

    def exec(self, command: str, *, cwd: str | None = None, timeout: float | None = None) -> ExecResult:
        limit = self.command_timeout if timeout is None else min(timeout, self.command_timeout)
        proc = subprocess.Popen(
            [self.shell, "-c", command], cwd=self._abs(cwd) if cwd else self.root, env=self.env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, _ = proc.communicate()
        text = out.decode("utf-8", errors="replace")
        truncated = len(text) > self.output_limit
        return ExecResult(exit_code=-1 if timed_out else proc.returncode,
                          output=text[: self.output_limit], timed_out=timed_out, truncated=truncated)

    def read_file(self, path: str) -> bytes:
        with open(self._abs(path), "rb") as fh:
            return fh.read()

    def write_file(self, path: str, data: bytes) -> None:
        full = self._abs(path)
        os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
        with open(full, "wb") as fh:
            fh.write(data)

    def warm(self) -> None:
        pass

    def close(self, wait: bool = True) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
