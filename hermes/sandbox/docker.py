"""DockerSandbox: one hardened container per prompt, on the docker SDK.

Its container is made as container.py says; it is removed (force) by `close()`, at
interpreter exit, when its run is interrupted (see lifecycle.RunGuard), or by `cleanup()`
once its owner is dead.

A command's output (stdout and stderr merged, in order) is capped; an endless flood of output
gets the command killed; a command killed by the memory limit is told so.

Engine work per sandbox is the machine's bare unit: create, start, ONE exec, remove. That exec
is a command channel (see channel.py): a small `sh` loop taking framed requests on its stdin,
so a tool call costs no engine round trip; a call that cannot have it gets an exec of its own,
as all calls once did. Creates, starts and removes pass the engine gate (engine.py).
close(wait=False) leaves the removal to background threads (removal.py).

The backend's other modules: engine.py (client, gate, capabilities, images), container.py
(create arguments, cwd/tmpfs policy, limit probe), channel.py (wrapper scripts, exec frames,
the channel), removal.py (leftovers, cleanup, background removal). Their public names are
importable from here too, where callers have always found them.
"""
from __future__ import annotations

import base64
import contextlib
import errno
import logging
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from hermes.sandbox import channel, lifecycle
from hermes.sandbox.base import (
    ExecResult,
    ImageUnavailable,
    OutputCap,
    SandboxError,
    SandboxSettings,
    SandboxSpec,
    resolve_cwd,
)
from hermes.sandbox.channel import (
    _BOOT,
    CHANNEL_HELLO_TIMEOUT,
    STALE_LIMIT,
    _arg,
    _Channel,
    _ChannelLost,
    _fmt_seconds,
    _Frames,
    _server_text,
)
from hermes.sandbox.container import KEEPALIVE, _container_args, limit_problems
from hermes.sandbox.engine import (
    _engine_call,
    _image_config,
    _lifecycle_client,
    _report_create_warnings,
    _verify_host_config,
    engine_available,
    engine_problems,
    ensure_image,
    get_client,
)
from hermes.sandbox.removal import (
    MAX_PENDING_REMOVALS,
    REMOVER_THREADS,
    Leftover,
    _live,
    _live_lock,
    _remove,
    _remove_later,
    cleanup,
    drain_removals,
    leftovers,
    pending_removals,
    remove,
    remove_own,
)

__all__ = [
    "CHANNEL_HELLO_TIMEOUT", "HOST_GRACE", "KEEPALIVE", "MAX_PENDING_REMOVALS", "MAX_READ_BYTES",
    "REMOVER_THREADS", "STALE_LIMIT", "DockerSandbox", "Leftover", "cleanup", "drain_removals",
    "engine_available", "engine_problems", "ensure_image", "get_client", "leftovers", "limit_problems",
    "pending_removals", "remove", "remove_own",
]

log = logging.getLogger(__name__)

#: extra seconds the host waits beyond a command's own time limit before giving up on it
HOST_GRACE = 5.0
#: read_file refuses files larger than this
MAX_READ_BYTES = 256 << 20


@dataclass
class _Outcome:
    """How reading one command's output ended."""

    end: tuple[int, int] | None = None  # (exit code, timer status) from the end marker
    target: str | None = None           # "-PGID" or "PID" to kill it by
    host_timed_out: bool = False
    flood_killed: bool = False
    broke: bool | OSError = False       # the stream ended (or failed: the error) before the end marker
    stale: int = 0                      # bytes of earlier commands' background jobs dropped
    begun: bool = True                  # on a channel: its start marker seen, so the command ran


class DockerSandbox:
    """One prompt's container. Create with ``DockerSandbox(spec, settings)``; close when done.

    Commands and file operations go over one long-lived channel exec (see channel._SERVER), opened on
    first use or by warm(); when it cannot be had (busy with a concurrent call, an image whose
    shell cannot serve it) a call gets an exec of its own, as every call once did.
    """

    def __init__(self, spec: SandboxSpec, settings: SandboxSettings, *, client: docker.DockerClient | None = None):
        self.spec = spec
        self.settings = settings
        self.client = client or get_client()
        self.api = self.client.api
        self.cwd = resolve_cwd(spec.cwd, settings.workdir)
        self.container_id: str | None = None
        self._closed = False
        self._oom_seen = 0
        self._lock = threading.Lock()
        self._chan: _Channel | None = None
        self._chan_lock = threading.Lock()  # one request at a time on the channel
        self._chan_usable = True            # False once its shell failed to answer: per-call execs only
        self._create()

    # -- life ---------------------------------------------------------------

    @property
    def command_timeout(self) -> float:
        return self.settings.command_timeout

    @property
    def id(self) -> str | None:
        return self.container_id

    def _lifecycle_api(self) -> Any:
        return _lifecycle_client(self.client, self.settings.engine_timeout).api

    def _create(self) -> None:
        s, spec, run = self.settings, self.spec, self.spec.run_label()
        lifecycle.raise_if_stopping(run)
        engine_problems(self.client)
        image_cfg = _image_config(spec.image, s.pull_timeout, self.client)
        args = _container_args(self.api, spec, s, self.cwd, image_cfg)
        with lifecycle.creating(run):
            try:
                with _engine_call(f"create of a container from {spec.image}", s):
                    res = self._lifecycle_api().create_container(**args)
            except ImageNotFound as e:
                raise ImageUnavailable(spec.image, str(e.explanation or e)) from e
            except (APIError, DockerException) as e:
                raise SandboxError(f"cannot create a container from {spec.image}: {getattr(e, 'explanation', None) or e}") from e
            self.container_id = res["Id"]
            with _live_lock:
                _live.add(self)
            if lifecycle.stopping(run):  # made while the run was being stopped: its cleanup may have missed it
                self.close()
                raise lifecycle.RunInterrupted(f"run {run} is stopping")
        _report_create_warnings(res.get("Warnings"))
        try:
            with _engine_call(f"start of container {self.container_id[:12]}", s):
                self._lifecycle_api().start(self.container_id)
            _verify_host_config(self.client, self.container_id, s)
        except BaseException as e:
            self.close(wait=False)  # a failing engine must not hold the prompt for a removal too
            if isinstance(e, DockerException):
                raise SandboxError(f"cannot start a container from {spec.image}: {getattr(e, 'explanation', None) or e}") from e
            raise

    def warm(self) -> None:
        """Open the command channel now (e.g. while the model thinks) rather than at first use."""
        if not self._chan_lock.acquire(blocking=False):
            return
        try:
            self._channel()
        except (SandboxError, DockerException, OSError) as e:
            log.debug("sandbox %s: channel not opened ahead: %s", (self.container_id or "")[:12], e)
        finally:
            self._chan_lock.release()

    def close(self, wait: bool = True) -> None:
        """Remove the container. `wait=False` hands the removal to the background removers
        (see drain_removals) so the caller, a prompt's slot, goes on at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with _live_lock:
            _live.discard(self)
        chan, self._chan = self._chan, None
        if chan is not None:
            chan.close()
        if self.container_id:
            if wait:
                _remove(self.client, self.container_id, self.settings)
            else:
                _remove_later(self.client, self.container_id, self.settings)

    def __enter__(self) -> "DockerSandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DockerSandbox({self.spec.image!r}, id={(self.container_id or '')[:12]}, cwd={self.cwd!r})"

    # -- engine execs -------------------------------------------------------------

    def _check_usable(self) -> None:
        lifecycle.raise_if_stopping(self.spec.run_label())  # its container is being removed: end the prompt
        if self._closed:
            raise SandboxError("sandbox is closed")

    def _exec_socket(self, cmd: list[str], stdin: bool = False, api: Any = None) -> tuple[str, _Frames]:
        self._check_usable()
        api = api or self.api
        try:
            ex = api.exec_create(self.container_id, cmd, stdout=True, stderr=True, stdin=stdin,
                                 user=self.settings.user)
            sock = api.exec_start(ex["Id"], socket=True)
        except NotFound as e:
            raise SandboxError(f"sandbox container {self.container_id[:12]} is gone: {e.explanation or e}") from e
        except APIError as e:
            self._raise_if_dead()
            raise SandboxError(f"sandbox container {self.container_id[:12]}: {e.explanation or e}") from e
        return ex["Id"], _Frames(sock)

    def _exit_code(self, exec_id: str) -> int:
        for _ in range(50):
            info = self.api.exec_inspect(exec_id)
            if not info.get("Running"):
                code = info.get("ExitCode")
                return -1 if code is None else int(code)
            time.sleep(0.02)
        return -1

    def _raise_if_dead(self) -> None:
        """A container that stopped (e.g. its memory filled up) cannot run anything more."""
        for attempt in range(3):  # the engine notices a dying container a moment late
            try:
                state = self.api.inspect_container(self.container_id).get("State") or {}
            except NotFound:
                state = {"Status": "removed"}
            except DockerException:
                return
            if not state.get("Running") or attempt == 2:
                break
            time.sleep(0.1)
        if not state.get("Running"):
            why = " (out of memory: OOM-killed)" if state.get("OOMKilled") else ""
            raise SandboxError(f"sandbox container {self.container_id[:12]} has stopped{why}: "
                               f"status {state.get('Status')}, exit code {state.get('ExitCode')}")

    def _kill(self, target: str) -> None:
        """Kill a process group ("-PGID") or a pid inside the container; best effort, retried:
        a command that filled the pids limit can leave no room for `kill` for a moment.
        An exec of its own: the channel is busy with the very command to kill."""
        why: object = None
        for _ in range(5):
            try:
                ex = self.api.exec_create(self.container_id, ["kill", "-9", target], user=self.settings.user)
                out = self.api.exec_start(ex["Id"]) or b""
                if self.api.exec_inspect(ex["Id"]).get("ExitCode") == 0 or b"No such process" in out:
                    return
                why = out.decode("utf-8", "replace").strip()
            except DockerException as e:
                why = e
            time.sleep(0.3)
        log.warning("could not kill %s in %s: %s", target, (self.container_id or "")[:12], why)

    def _stopped_run_wins(self, fn: Any, *args: Any) -> Any:
        """A sandbox failing because its run is being stopped ends the prompt (RunInterrupted),
        instead of handing the model a broken tool result to carry on with."""
        try:
            return fn(*args)
        except (SandboxError, DockerException, OSError):
            lifecycle.raise_if_stopping(self.spec.run_label())
            raise

    # -- the channel --------------------------------------------------------------

    @contextlib.contextmanager
    def _using_channel(self) -> Iterator[_Channel | None]:
        """The open channel for one request, or None: then the caller uses an exec of its own.
        A concurrent call does not queue behind a long command: it gets its own exec."""
        self._check_usable()
        if not self._chan_usable or not self._chan_lock.acquire(blocking=False):
            yield None
            return
        try:
            yield self._channel()
        finally:
            self._chan_lock.release()

    def _channel(self) -> _Channel | None:
        """The channel, opened (and greeted) if need be; None if this container's shell cannot
        serve one. Caller holds _chan_lock."""
        if self._chan is not None or not self._chan_usable:
            return self._chan
        self._check_usable()
        text = _server_text()
        with _engine_call(f"channel exec in {self.container_id[:12]}", self.settings):
            exec_id, frames = self._exec_socket(["sh", "-c", _BOOT.format(n=len(text)), "hermes-channel"], stdin=True,
                                                api=self._lifecycle_api())
        chan = _Channel(exec_id, frames)
        nonce = secrets.token_hex(8)
        deadline = time.monotonic() + CHANNEL_HELLO_TIMEOUT
        try:
            chan.pid = self._chan_hello(chan, text, deadline)
            code, payload = self._chan_request(chan, f"{nonce} p {_arg('hermes')}\n".encode(), nonce, deadline)
        except SandboxError as e:
            code, payload = None, str(e).encode()
        if code != 0:
            chan.close()
            self._raise_if_dead()
            self._chan_usable = False
            log.info("sandbox %s: no command channel (%s); every call gets an exec of its own",
                     self.container_id[:12], payload.decode("utf-8", "replace").strip()[:200] or f"exit {code}")
            return None
        self._chan = chan
        return chan

    def _chan_hello(self, chan: _Channel, text: bytes, deadline: float) -> str:
        """Hand the new channel its script; its PID once it listens."""
        hello = re.compile(rb"~hermes-channel (\d+)\n")
        buf = bytearray()
        try:
            chan.send(text, deadline)
            while not (m := hello.search(buf)):
                frame = chan.frames.next(deadline)
                if frame is None:
                    raise SandboxError(f"its shell ended: {bytes(buf[-200:]).decode('utf-8', 'replace').strip()}")
                buf += frame[1]
        except OSError as e:
            raise SandboxError(f"its shell did not start: {e}") from e
        return m.group(1).decode()

    def _drop_channel(self, chan: _Channel) -> None:
        """A channel whose last request did not end cleanly is not trusted again: the next call
        opens a new one. Its shell ends by itself once its current command has."""
        if self._chan is chan:
            self._chan = None
        chan.close()

    def _chan_request(self, chan: _Channel, request: bytes, nonce: str, deadline: float,
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
                        raise _ChannelLost("sandbox command channel closed before it took the request")
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
                            self._drop_channel(chan)
                        return (int(code) if code.isdigit() else -1), bytes(buf[:at])
                if len(buf) > limit:
                    raise SandboxError(f"file larger than {MAX_READ_BYTES} bytes")
        except (socket.timeout, TimeoutError) as e:
            self._drop_channel(chan)
            raise SandboxError("sandbox command channel did not answer in time") from e
        except OSError as e:
            self._drop_channel(chan)
            raise SandboxError(f"sandbox command channel broke: {e}") from e
        except SandboxError:
            self._drop_channel(chan)
            raise

    # -- commands -------------------------------------------------------------

    def exec(self, command: str, *, cwd: str | None = None, timeout: float | None = None) -> ExecResult:
        return self._stopped_run_wins(self._exec, command, cwd, timeout)

    def _exec(self, command: str, cwd: str | None, timeout: float | None) -> ExecResult:
        started = time.monotonic()
        limit = self.settings.command_timeout if timeout is None else float(timeout)
        workdir = resolve_cwd(cwd, self.cwd)
        nonce = secrets.token_hex(8)
        cap = OutputCap(self.settings.output_limit)
        deadline = started + limit + HOST_GRACE
        out: _Outcome | None = None
        for _ in range(2):  # a second time only when the channel's shell was gone before the command began
            with self._using_channel() as chan:
                if chan is None:
                    break
                request = f"{nonce} x {_fmt_seconds(limit)} {_arg(workdir)} {_arg(command)}\n".encode()
                try:
                    chan.send(request, deadline)
                except OSError:
                    self._drop_channel(chan)
                    continue
                out, exec_id = self._read_output(chan.frames, nonce, deadline, cap, f"\n{nonce} s\n".encode()), chan.exec_id
                if out.end is None or out.stale > STALE_LIMIT:
                    self._drop_channel(chan)
                if out.broke is True and not out.begun:
                    out = None
                    continue
                break
        if out is None:  # channel._WRAPPER, not a copy: the one the channel's script is made of
            exec_id, frames = self._exec_socket(["sh", "-c", channel._WRAPPER, "hermes-exec", nonce, _fmt_seconds(limit), workdir,
                                                 command])
            try:
                out = self._read_output(frames, nonce, deadline, cap, None)
            finally:
                frames.close()
            if isinstance(out.broke, OSError):
                raise SandboxError(f"exec stream broke: {out.broke}") from out.broke
        return self._finish(out, cap, exec_id, limit, started)  # the channel is free again: _why_killed may use it

    def _read_output(self, frames: _Frames, nonce: str, deadline: float, cap: OutputCap,
                     begin: bytes | None) -> _Outcome:
        """Feed one command's output to `cap` until its end marker. On a channel, `begin` is the
        request's start marker: output before it is late output of earlier commands' background jobs."""
        out = _Outcome(begun=begin is None)
        prefix = b"\n" + nonce.encode() + b" "
        tag = re.compile(re.escape(nonce.encode()) + rb" (pgid|pid) (\d+)")
        pending, control = bytearray(), bytearray()
        while out.end is None:
            try:
                frame = frames.next(deadline)
            except (socket.timeout, TimeoutError):
                out.host_timed_out = True
                break
            except OSError as e:
                out.broke = e
                break
            if frame is None:
                out.broke = True
                break
            stream, payload = frame
            if stream == 2:
                if out.target is None:
                    control = (control + payload)[-4096:]
                    m = tag.search(control)
                    if m:
                        out.target = ("-" if m.group(1) == b"pgid" else "") + m.group(2).decode()
                continue
            pending += payload
            if begin is not None:
                at = pending.find(begin)
                if at < 0:
                    drop = max(0, len(pending) - len(begin))
                    out.stale += drop
                    del pending[:drop]
                    continue
                out.stale += at
                del pending[:at + len(begin)]
                begin, out.begun = None, True
            at = pending.find(prefix)
            if at >= 0:
                nl = pending.find(b"\n", at + len(prefix))
                if nl >= 0:
                    parts = pending[at + len(prefix):nl].split()
                    try:
                        out.end = (int(parts[0]), int(parts[1]))
                    except (IndexError, ValueError):
                        out.end = (-1, 1)
                cap.feed(bytes(pending[:at]))
                del pending[:at]
            elif len(pending) > len(prefix) + 32:
                cut = len(pending) - (len(prefix) + 32)
                cap.feed(bytes(pending[:cut]))
                del pending[:cut]
            if cap.flooded and not out.flood_killed and out.target:
                out.flood_killed = True
                self._kill(out.target)
        if out.end is None:
            if begin is None:
                cap.feed(bytes(pending))
            if not out.host_timed_out:
                self._raise_if_dead()
            elif out.target:
                self._kill(out.target)
        return out

    def _finish(self, out: _Outcome, cap: OutputCap, exec_id: str, limit: float, started: float) -> ExecResult:
        text, truncated = cap.result()
        if out.flood_killed:
            text += f"\n[command killed: it kept writing output ({cap.total} bytes)]"
        if out.end is not None:
            code, fired = out.end
            # The timer's kill succeeded and the command died of it. The timer's own status is lost
            # when the wrapper reaps it a moment after it fired: then the clock says so.
            timed_out = code >= 128 and (fired == 0 or time.monotonic() - started >= limit)
            exit_code = -1 if (timed_out or out.flood_killed) else code
        elif out.host_timed_out:
            timed_out, exit_code = True, -1
        else:  # the wrapper (or the channel's shell) itself died, e.g. out of memory; ask the engine
            timed_out, exit_code = False, self._exit_code(exec_id)
            if exit_code == 0:
                exit_code = -1
        if exit_code == 137 and not timed_out:
            text += ("" if text.endswith("\n") or not text else "\n") + self._why_killed()
        return ExecResult(exit_code=exit_code, output=text, timed_out=timed_out, truncated=truncated,
                          duration=time.monotonic() - started)

    def _why_killed(self) -> str:
        """A note for a command that died of SIGKILL: did the memory limit do it?"""
        kills = self._oom_kills()
        if kills is None:
            return "[killed by signal 9 (SIGKILL); the sandbox may be out of memory]"
        seen, self._oom_seen = self._oom_seen, max(self._oom_seen, kills)
        if kills > seen:
            return (f"[killed: the sandbox ran out of memory (limit {self.settings.memory}); "
                    f"its largest process was killed]")
        return "[killed by signal 9 (SIGKILL)]"

    def _oom_kills(self) -> int | None:
        """The container's count of out-of-memory kills (cgroup v1 or v2), None if unreadable."""
        out = b""
        for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
            try:
                out = self._read_file(path)
            except (OSError, SandboxError, DockerException):
                continue
            break
        m = re.search(rb"^oom_kill (\d+)", out, re.M)
        return int(m.group(1)) if m else None

    # -- files ----------------------------------------------------------------

    def _run_plain(self, cmd: list[str], data: bytes | None, timeout: float) -> tuple[bytes, bytes, int]:
        exec_id, frames = self._exec_socket(cmd, stdin=data is not None)
        deadline = time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        try:
            if data is not None:
                frames.raw.settimeout(timeout)
                try:
                    frames.raw.sendall(data)
                    frames.raw.shutdown(socket.SHUT_WR)
                except OSError as e:
                    raise SandboxError(f"could not send data to the sandbox: {e}") from e
            while True:
                try:
                    frame = frames.next(deadline)
                except (socket.timeout, TimeoutError) as e:
                    raise SandboxError(f"file operation did not finish within {timeout:g}s") from e
                if frame is None:
                    break
                (out if frame[0] == 1 else err).extend(frame[1])
                if len(out) > MAX_READ_BYTES:
                    raise SandboxError(f"file larger than {MAX_READ_BYTES} bytes")
        finally:
            frames.close()
        return bytes(out), bytes(err), self._exit_code(exec_id)

    def _file_timeout(self, size: int = 0) -> float:
        return max(self.settings.command_timeout, 30.0) + size / (5 << 20)

    def read_file(self, path: str) -> bytes:
        return self._stopped_run_wins(self._read_file, path)

    def _file_request(self, make: Any, timeout: float) -> tuple[int, bytes] | None:
        """(exit code, payload) of one file request over the channel; None: no channel, use an exec."""
        for attempt in range(2):
            with self._using_channel() as chan:
                if chan is None:
                    return None
                nonce = secrets.token_hex(8)
                try:
                    return self._chan_request(chan, make(nonce), nonce, time.monotonic() + timeout)
                except _ChannelLost:
                    if attempt:
                        raise
        return None

    def _read_file(self, path: str) -> bytes:
        answer = self._file_request(lambda n: f"{n} r {_arg(self.cwd)} {_arg(path)}\n".encode(), self._file_timeout())
        if answer is not None:
            code, payload = answer
            if code == 0:
                try:
                    return base64.b64decode(payload)
                except ValueError as e:
                    raise SandboxError(f"{path}: unreadable answer from the sandbox: {e}") from e
            _raise_file_error(code, payload, path)
        out, err, code = self._run_plain(["sh", "-c", channel._READ, "hermes-read", self.cwd, path], None, self._file_timeout())
        if code == 0:
            return out
        _raise_file_error(code, err, path)
        raise AssertionError  # unreachable

    def write_file(self, path: str, data: bytes) -> None:
        self._stopped_run_wins(self._write_file, path, data)

    def _write_file(self, path: str, data: bytes) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8")
        data = bytes(data)
        answer = self._file_request(lambda n: f"{n} w {_arg(self.cwd)} {_arg(path)} {len(data)}\n".encode() + data,
                                    self._file_timeout(len(data)))
        if answer is not None:
            if answer[0] != 0:
                _raise_file_error(answer[0], answer[1], path)
            return
        _, err, code = self._run_plain(["sh", "-c", channel._WRITE, "hermes-write", self.cwd, path], data,
                                       self._file_timeout(len(data)))
        if code != 0:
            _raise_file_error(code, err, path)


def _raise_file_error(code: int, err: bytes, path: str) -> None:
    msg = err.decode("utf-8", "replace").strip() or f"exit code {code}"
    if code == 3:
        raise FileNotFoundError(errno.ENOENT, msg, path)
    if code == 4:
        raise IsADirectoryError(errno.EISDIR, msg, path)
    if "Permission denied" in msg or "Read-only file system" in msg:
        raise PermissionError(errno.EACCES, msg, path)
    raise SandboxError(f"{path}: {msg}")
