"""A runc sandbox's command channel: the pipes of its init process (channel.SERVER, the docker
backend's channel script, is the sandbox's PID 1), and of a per-call `runc exec`, read as the
docker backend reads an exec stream: (stream number, payload) pairs, 1 stdout, 2 stderr.

PID 1 of a pid namespace gets no signal from inside it that it has no handler for, and
`kill -9 -1` skips it: a command cannot kill the channel, only its own wrapper (whose end the
channel then reports). When the owner process dies its end of the pipes closes: the channel's
`read` sees end of file, PID 1 exits and the kernel kills every process of the sandbox.
"""
from __future__ import annotations

import os
import selectors
import socket
import time
from typing import Callable

from hermes.sandbox.docker.channel import WATCH_SECONDS
from hermes.sandbox.docker.link import ChannelLink


#: most bytes read from a stream after the other ended (a pipe holds 64 KiB; a job of the
#: command's that keeps writing must not hold the reader)
DRAIN_BYTES = 1 << 20


class PipeFrames:
    """stdout and stderr of a process as frames; None once either ends (the process is gone),
    after what the other already holds: a plain exec's wrapper writes its end marker on stdout,
    then exits, closing stderr; that end can be seen first, with the marker still unread."""

    def __init__(self, out_fd: int, err_fd: int, alive: Callable[[], bool] | None = None):
        self.alive = alive or (lambda: True)
        self._sel = selectors.DefaultSelector()
        self._fds = {out_fd: 1, err_fd: 2}
        for fd, stream in self._fds.items():
            os.set_blocking(fd, False)
            self._sel.register(fd, selectors.EVENT_READ, stream)
        self._ended = False
        self._draining: list[int] = []  # once one stream ended: the others, read until empty
        self._drain_left = DRAIN_BYTES

    def next(self, deadline: float) -> tuple[int, bytes] | None:
        while self._draining:
            fd = self._draining[0]
            try:
                data = os.read(fd, 65536) if self._drain_left > 0 else b""
            except (BlockingIOError, OSError):
                data = b""
            if data:
                self._drain_left -= len(data)  # what a background job writes on is not waited for
                return self._fds[fd], data
            self._draining.pop(0)
        while not self._ended:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline")
            if not self.alive():
                return None
            for key, _ in self._sel.select(min(left, WATCH_SECONDS)):
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    self._ended = True
                    self._draining = [fd for fd in self._fds if fd != key.fd]
                    return self.next(deadline)
                return key.data, data
        return None

    def close(self) -> None:
        self._ended = True
        self._draining = []
        self._sel.close()


class PipeChannel:
    """The init's channel: requests to its stdin, frames from its stdout and stderr."""

    def __init__(self, stdin_fd: int, frames: PipeFrames):
        self.exec_id = "init"
        self.frames = frames
        self.pid: str | None = None
        self._fd = stdin_fd
        os.set_blocking(stdin_fd, False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(stdin_fd, selectors.EVENT_WRITE)

    def send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("the sandbox's channel took no more input in time")
            if not self._sel.select(min(left, WATCH_SECONDS)):
                continue
            try:
                view = view[os.write(self._fd, view):]
            except BlockingIOError:
                continue

    def close(self) -> None:
        # The pipes stay open: closing the init's stdin would end the whole sandbox. A channel not
        # trusted again is only no longer read; the sandbox's close ends it.
        self.frames.close()


class InitLink(ChannelLink):
    """The docker backend's channel discipline (one request at a time, a concurrent call gets a
    call of its own, a request that did not end cleanly drops the channel) over the init's pipes.
    A dropped channel is not reopened: later calls each get a `runc exec`."""

    def __init__(self, sb, chan: PipeChannel):
        super().__init__(sb)
        self.chan = chan

    def _open(self) -> PipeChannel | None:
        return self.chan
