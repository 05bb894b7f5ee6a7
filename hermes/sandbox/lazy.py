"""A prompt's sandbox, made on first use or, with prefetch, while the model is thinking.

Without prefetch a prompt that never calls a tool never costs a container. With prefetch the
container is started in a background thread as the prompt starts, so the first tool call
finds it ready instead of waiting for `docker run`; close() waits for a creation still under
way and removes its result, so no path leaks a container.

With `remove_in_background` (what a run's prompts use), close() hands the container to the
backend's background removers instead of waiting for the engine, so the prompt's worker slot
is free at once; the run waits for them at its end (the backend's end_run).
"""
from __future__ import annotations

import contextvars
import threading
import time
from concurrent.futures import Executor, Future
from typing import Callable

from hermes.sandbox.base import EngineTimeout, ExecResult, Sandbox, SandboxError


class LazySandbox:
    def __init__(self, factory: Callable[[], Sandbox], command_timeout: float, *, prefetch: bool = False,
                 remove_in_background: bool = False, prefetch_on: Executor | None = None):
        """prefetch_on: the pool a prefetch runs on (a batch run's offload threads) instead of a
        thread of its own."""
        self._factory = factory
        self._remove_in_background = remove_in_background
        self.command_timeout = command_timeout  # known before the sandbox exists: tools cap by it
        #: seconds the first tool call waited for the sandbox (None: no tool call yet)
        self.wait: float | None = None
        self._sandbox: Sandbox | None = None
        self._failure: BaseException | None = None
        self._building: threading.Thread | Future | None = None
        self._lock = threading.Lock()
        self._closed = False
        if prefetch:
            self._prefetch(prefetch_on)

    @property
    def started(self) -> bool:
        return self._sandbox is not None

    def _prefetch(self, pool: Executor | None) -> None:
        run = contextvars.copy_context().run  # its logs belong to this prompt's run
        if pool is not None:
            self._building = pool.submit(run, self._build)
            return
        self._building = threading.Thread(target=run, args=(self._build,), name="sandbox-prefetch")
        self._building.start()

    def _build(self) -> None:
        try:
            sandbox = self._factory()
        except BaseException as e:  # handed to the first tool call, which reports it
            self._failure = e
            return
        self._sandbox = sandbox
        sandbox.warm()  # the docker backend opens its command channel now, not at the first tool call

    def _await_prefetch(self) -> None:
        building, self._building = self._building, None
        if isinstance(building, threading.Thread):
            building.join()
        elif building is not None and not building.cancel():
            # under way on another of the pool's threads: wait for it. Not started yet: it never
            # will be, and the sandbox is made here instead (a call waiting on the pool for a
            # prefetch queued behind it could wait for ever when every thread waits likewise).
            building.result()

    def _get(self) -> Sandbox:
        asked = time.monotonic()
        with self._lock:
            if self._closed:
                raise SandboxError("sandbox already closed")
            self._await_prefetch()
            failure = self._failure
            if not isinstance(failure, EngineTimeout):
                self._failure = None
            if failure is not None:
                # Once: a later call tries again. Not after the engine failed to answer in time:
                # asking again would hold the prompt as long again.
                raise failure
            if self._sandbox is None:
                try:
                    self._sandbox = self._factory()
                except EngineTimeout as e:
                    self._failure = e
                    raise
            if self._closed:
                # abort() came while the sandbox was being made (it found none to end): end it here,
                # or the call would run in it with nobody left to stop it
                made, self._sandbox = self._sandbox, None
                made.close(wait=not self._remove_in_background)
                raise SandboxError("sandbox already closed")
            if self.wait is None:
                self.wait = time.monotonic() - asked
            return self._sandbox

    def exec(self, command: str, *, cwd: str | None = None, timeout: float | None = None) -> ExecResult:
        return self._get().exec(command, cwd=cwd, timeout=timeout)

    def read_file(self, path: str) -> bytes:
        return self._get().read_file(path)

    def write_file(self, path: str, data: bytes) -> None:
        self._get().write_file(path, data)

    def networked_copy(self) -> Sandbox:
        """The sandbox as it is now, in one of its own with the network (--verifier_network); close it after."""
        make = getattr(self._get(), "networked_copy", None)
        if make is None:
            raise SandboxError("this sandbox backend cannot give a verifier the network apart from its agent")
        return make()

    def abort(self) -> None:
        """End the sandbox now, from another thread, while a call may be blocked in it (a prompt
        past its deadline): later calls fail, the blocked one fails as its container goes. The
        owner's close() still runs and removes whatever a creation under way made."""
        self._closed = True
        sandbox = self._sandbox
        if sandbox is not None:
            sandbox.close(wait=not self._remove_in_background)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._await_prefetch()
            sandbox, self._sandbox = self._sandbox, None
        if sandbox is None:
            return
        sandbox.close(wait=not self._remove_in_background)

    def __enter__(self) -> "LazySandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
