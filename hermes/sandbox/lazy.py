"""A sandbox made on first use, so a prompt that never calls a tool never costs a container."""
from __future__ import annotations

import threading
from typing import Callable

from hermes.sandbox.base import ExecResult, Sandbox


class LazySandbox:
    def __init__(self, factory: Callable[[], Sandbox], command_timeout: float):
        self._factory = factory
        self.command_timeout = command_timeout  # known before the sandbox exists: tools cap by it
        self._sandbox: Sandbox | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def started(self) -> bool:
        return self._sandbox is not None

    def _get(self) -> Sandbox:
        with self._lock:
            if self._closed:
                raise RuntimeError("sandbox already closed")
            if self._sandbox is None:
                self._sandbox = self._factory()
            return self._sandbox

    def exec(self, command: str, *, cwd: str | None = None, timeout: float | None = None) -> ExecResult:
        return self._get().exec(command, cwd=cwd, timeout=timeout)

    def read_file(self, path: str) -> bytes:
        return self._get().read_file(path)

    def write_file(self, path: str, data: bytes) -> None:
        self._get().write_file(path, data)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            sandbox.close()

    def __enter__(self) -> "LazySandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
