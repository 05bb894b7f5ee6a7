"""A container's command channel as its sandbox uses it: opened (and greeted) on first use,
one request at a time, dropped when a request did not end cleanly, given up for good when the
container's shell cannot serve one (then every call gets an exec of its own).
"""
from __future__ import annotations

import contextlib
import logging
import re
import secrets
import socket
import threading
import time
from typing import TYPE_CHECKING, Iterator

from docker.errors import DockerException

from hermes.sandbox.base import SandboxError
from hermes.sandbox.docker.channel import (
    BOOT,
    CHANNEL_HELLO_TIMEOUT,
    STALE_LIMIT,
    Channel,
    ChannelLost,
    request,
    server_text,
)
from hermes.sandbox.docker.engine import engine_call

if TYPE_CHECKING:
    from hermes.sandbox.docker.sandbox import DockerSandbox

log = logging.getLogger(__name__)

#: read_file refuses files larger than this
MAX_READ_BYTES = 256 << 20


class ChannelLink:
    """The channel of one DockerSandbox (see channel.SERVER); its only holder."""

    def __init__(self, sb: "DockerSandbox"):
        self.sb = sb
        self.chan: Channel | None = None
        self._lock = threading.Lock()  # one request at a time on the channel
        self.usable = True             # False once its shell failed to answer: per-call execs only
        self._state = threading.Lock()  # close() against a channel being opened
        self._closed = False

    def warm(self) -> None:
        """Open the channel now (e.g. while the model thinks) rather than at first use."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._open()
        except (SandboxError, DockerException, OSError) as e:
            log.debug("sandbox %s: channel not opened ahead: %s", (self.sb.container_id or "")[:12], e)
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._state:
            self._closed = True
            chan, self.chan = self.chan, None
        if chan is not None:
            chan.close()

    @contextlib.contextmanager
    def using(self) -> Iterator[Channel | None]:
        """The open channel for one request, or None: then the caller uses an exec of its own.
        A concurrent call does not queue behind a long command: it gets its own exec."""
        self.sb.check_usable()
        if not self.usable or not self._lock.acquire(blocking=False):
            yield None
            return
        try:
            yield self._open()
        finally:
            self._lock.release()

    def _open(self) -> Channel | None:
        """The channel, opened (and greeted) if need be; None if this container's shell cannot
        serve one. Caller holds the lock."""
        if self.chan is not None or not self.usable:
            return self.chan
        self.sb.check_usable()
        text = server_text()
        with engine_call(f"channel exec in {self.sb.container_id[:12]}", self.sb.settings):
            exec_id, frames = self.sb.exec_socket(["sh", "-c", BOOT.format(n=len(text)), "hermes-channel"], stdin=True,
                                                  api=self.sb.lifecycle_api())
        chan = Channel(exec_id, frames)
        nonce = secrets.token_hex(8)
        deadline = time.monotonic() + CHANNEL_HELLO_TIMEOUT
        try:
            chan.pid = hello(chan, text, deadline)
            code, payload = self.request(chan, request(nonce, "p", args=("hermes", "a'b\n")), nonce, deadline)
        except SandboxError as e:
            code, payload = None, str(e).encode()
        if code != 0:
            chan.close()
            self.sb.raise_if_dead()
            self.usable = False
            log.info("sandbox %s: no command channel (%s); every call gets an exec of its own",
                     self.sb.container_id[:12], payload.decode("utf-8", "replace").strip()[:200] or f"exit {code}")
            return None
        with self._state:
            if self._closed:
                # closed while this one was being greeted: nobody would end what is sent on it
                chan.close()
                raise SandboxError("sandbox is closed")
            self.chan = chan
        return chan

    def drop(self, chan: Channel) -> None:
        """A channel whose last request did not end cleanly is not trusted again: the next call
        opens a new one. Its shell ends by itself once its current command has."""
        if self.chan is chan:
            self.chan = None
        chan.close()

    def request(self, chan: Channel, request: bytes, nonce: str, deadline: float,
                limit: int = MAX_READ_BYTES * 4 // 3 + 4096) -> tuple[int, bytes]:
        """Send one file request or ping; (exit code, payload) from its answer on stderr.
        Output of earlier commands' background jobs (stdout) is dropped. SandboxError (and the
        channel dropped) when no clean answer comes by the deadline."""
        start, end = f"~{nonce}\n".encode(), f"\n~{nonce} ".encode()
        buf = bytearray()
        begun, stale = False, 0
        try:
            chan.send(request, deadline)
            while True:
                frame = chan.frames.next(deadline)
                if frame is None:
                    if not begun:
                        raise ChannelLost("sandbox command channel closed before it took the request")
                    raise SandboxError("sandbox command channel closed")
                if frame[0] != 2:
                    stale += len(frame[1])
                    continue
                buf += frame[1]
                if not begun:
                    at = buf.find(start)
                    if at < 0:
                        del buf[:max(0, len(buf) - len(start))]
                        continue
                    del buf[:at + len(start)]
                    begun = True
                at = buf.find(end)
                if at >= 0:
                    nl = buf.find(b"\n", at + len(end))
                    if nl >= 0:
                        code = buf[at + len(end):nl].strip()
                        if stale > STALE_LIMIT:
                            self.drop(chan)
                        return (int(code) if code.isdigit() else -1), bytes(buf[:at])
                if len(buf) > limit:
                    raise SandboxError(f"file larger than {MAX_READ_BYTES} bytes")
        except (socket.timeout, TimeoutError) as e:
            self.drop(chan)
            raise SandboxError("sandbox command channel did not answer in time") from e
        except OSError as e:
            self.drop(chan)
            raise SandboxError(f"sandbox command channel broke: {e}") from e
        except SandboxError:
            self.drop(chan)
            raise


def hello(chan, text: bytes, deadline: float) -> str:
    """Hand a new channel (a Channel, or the runc backend's PipeChannel) its script; its shell's
    PID once it listens."""
    greeting = re.compile(rb"~hermes-channel (\d+)\n")
    buf = bytearray()
    try:
        chan.send(text, deadline)
        while not (m := greeting.search(buf)):
            frame = chan.frames.next(deadline)
            if frame is None:
                raise SandboxError(f"its shell ended: {bytes(buf[-300:]).decode('utf-8', 'replace').strip()}")
            buf += frame[1]
    except OSError as e:
        raise SandboxError(f"its shell did not start: {e}") from e
    return m.group(1).decode()
