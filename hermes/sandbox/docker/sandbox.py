"""DockerSandbox: one hardened container per prompt, on the docker SDK.

Its container is made as container.py says; it is removed (force) by `close()`, at
interpreter exit (removal.Removals), when its run is interrupted (the backend's guard_run),
by the backend's cleanup() once its owner is dead, or by the engine itself when its main
process ends (the spec's deadline, or the container's death: AutoRemove).

A command's output (stdout and stderr merged, in order) is capped; an endless flood of output
gets the command killed; a command killed by the memory limit is told so.

Engine work per sandbox is the machine's bare unit: create, start, ONE exec, remove. That exec
is a command channel (see channel.py): a small `sh` loop taking framed requests on its stdin,
so a tool call costs no engine round trip; a call that cannot have it gets an exec of its own,
as all calls once did. Creates, starts and removes pass the engine gate (engine.py).
close(wait=False) leaves the removal to background threads (removal.py).

The backend's other modules: engine.py (client, gate, capabilities, images), container.py
(create arguments, cwd/tmpfs policy, limit probe), channel.py (wrapper scripts, exec frames,
the channel exec), link.py (this sandbox's use of its channel), output.py (reading a
command's output), removal.py (leftovers, background removal); __init__.py is the backend.
"""
from __future__ import annotations

import logging
import re
import secrets
import socket
import threading
import time
from typing import Any

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from hermes.sandbox import lifecycle
from hermes.sandbox.base import (
    ExecResult,
    ImageUnavailable,
    OutputCap,
    SandboxError,
    SandboxSettings,
    SandboxSpec,
    resolve_cwd,
)
from hermes.sandbox.docker import channel, networked
from hermes.sandbox.docker.channel import STALE_LIMIT, ChannelLost, Frames, fmt_seconds, request
from hermes.sandbox.docker.container import container_args
from hermes.sandbox.docker.files import ChannelFiles
from hermes.sandbox.docker.engine import (
    engine_call,
    engine_problems,
    get_client,
    image_config,
    lifecycle_client,
    report_create_warnings,
    verify_host_config,
)
from hermes.sandbox.docker.link import MAX_READ_BYTES, ChannelLink
from hermes.sandbox.docker.profile import task_settings
from hermes.sandbox.docker.output import Outcome, finish, read_output
from hermes.sandbox.docker.removal import remove_one, removals

log = logging.getLogger(__name__)
#: the shell's own kill: a `kill` program may not take a process group as "-PGID" (procps's, on
#: the default Debian image, reads it as an option and kills nothing; busybox's refuses "--")
KILL = ["sh", "-c", 'kill -9 "$1"', "kill"]

#: reads of the engine's events for a removed container's `die` (each waits up to 0.5 s)
REMOVED_EVENT_TRIES = 4
#: extra seconds the host waits beyond a command's own time limit before giving up on it
HOST_GRACE = 5.0
#: how long a command whose stream ended early waits for the engine to say whether its container died
DEATH_NOTICE_SECONDS = 2.0


class DockerSandbox(ChannelFiles):
    """One prompt's container. Create with ``DockerSandbox(spec, settings)``; close when done.

    Commands and file operations go over one long-lived channel exec (see channel.SERVER), opened on
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
        self._link = ChannelLink(self)
        #: commands' exec streams outside the channel: close() shuts them, so their readers end now
        self._streams: set[Frames] = set()
        self._create()

    # -- life ---------------------------------------------------------------

    @property
    def command_timeout(self) -> float:
        return self.settings.command_timeout

    @property
    def id(self) -> str | None:
        return self.container_id

    def lifecycle_api(self) -> Any:
        """The engine API with the settings' time limit (the shared client waits 120 s)."""
        return lifecycle_client(self.client, self.settings.engine_timeout).api

    def _create(self) -> None:
        s, spec, run = self.settings, self.spec, self.spec.run_label()
        lifecycle.raise_if_stopping(run)
        engine_problems(self.client)
        image_cfg = image_config(spec.image, s.pull_timeout, self.client)
        if spec.profile is not None:  # a task image as published: its USER and WORKDIR, a writable root
            self.settings = s = task_settings(s, spec.profile, image_cfg)
            self.cwd = resolve_cwd(spec.cwd, s.workdir)
        args = container_args(self.api, spec, s, self.cwd, image_cfg)
        self._made_at = int(time.time()) - 1  # its events, once the engine removed it, are read from here
        with lifecycle.creating(run):
            try:
                with engine_call(f"create of a container from {spec.image}", s):
                    res = self.lifecycle_api().create_container(**args)
            except ImageNotFound as e:
                raise ImageUnavailable(spec.image, str(e.explanation or e)) from e
            except (APIError, DockerException) as e:
                raise SandboxError(f"cannot create a container from {spec.image}: {getattr(e, 'explanation', None) or e}") from e
            self.container_id = res["Id"]
            removals.opened(self)
            if lifecycle.stopping(run):  # made while the run was being stopped: its cleanup may have missed it
                self.close()
                raise lifecycle.RunInterrupted(f"run {run} is stopping")
        report_create_warnings(res.get("Warnings"))
        try:
            with engine_call(f"start of container {self.container_id[:12]}", s):
                self.lifecycle_api().start(self.container_id)
            verify_host_config(self.client, self.container_id, s)
        except BaseException as e:
            self.close(wait=False)  # a failing engine must not hold the prompt for a removal too
            if isinstance(e, DockerException):
                raise SandboxError(f"cannot start a container from {spec.image}: {getattr(e, 'explanation', None) or e}") from e
            raise

    def warm(self) -> None:
        """Open the command channel now (e.g. while the model thinks) rather than at first use."""
        self._link.warm()

    def close(self, wait: bool = True) -> None:
        """Remove the container. `wait=False` hands the removal to the background removers
        (the backend's drain() waits for them) so the caller, a prompt's slot, goes on at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            streams, self._streams = list(self._streams), set()
        removals.closed(self)
        self._link.close()
        for frames in streams:  # a command waited on ends now, not when the engine closes its stream
            frames.close()
        if self.container_id:
            if wait:
                remove_one(self.client, self.container_id, self.settings)
            else:
                removals.remove_later(self.client, self.container_id, self.settings)

    def networked_copy(self) -> "DockerSandbox":
        """This container as it is now, in one of its own with the network (a task's verifier: networked.py)."""
        return networked.networked_copy(self, DockerSandbox)

    def __enter__(self) -> "DockerSandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DockerSandbox({self.spec.image!r}, id={(self.container_id or '')[:12]}, cwd={self.cwd!r})"

    # -- engine execs -------------------------------------------------------------

    def check_usable(self) -> None:
        lifecycle.raise_if_stopping(self.spec.run_label())  # its container is being removed: end the prompt
        if self._closed:
            raise SandboxError("sandbox is closed")

    def exec_socket(self, cmd: list[str], stdin: bool = False, api: Any = None) -> tuple[str, Frames]:
        self.check_usable()
        api = api or self.api
        try:
            ex = api.exec_create(self.container_id, cmd, stdout=True, stderr=True, stdin=stdin,
                                 user=self.settings.user)
            sock = api.exec_start(ex["Id"], socket=True)
        except NotFound as e:
            self.raise_if_dead()  # it died and the engine removed it: its events say how (an OOM kill, 137)
            raise SandboxError(f"sandbox container {self.container_id[:12]} is gone: {e.explanation or e}") from e
        except APIError as e:
            self.raise_if_dead()
            raise SandboxError(f"sandbox container {self.container_id[:12]}: {e.explanation or e}") from e
        return ex["Id"], Frames(sock, alive=lambda: not self._closed)

    def _exit_code(self, exec_id: str) -> int:
        for _ in range(50):
            info = self.api.exec_inspect(exec_id)
            if not info.get("Running"):
                code = info.get("ExitCode")
                return -1 if code is None else int(code)
            time.sleep(0.02)
        return -1

    def raise_if_dead(self) -> None:
        """A container that stopped (e.g. its memory filled up) cannot run anything more."""
        # Asked only when a command's stream ended without its end marker. The engine notices a
        # dying container a moment late: 0.2 s of asking was once too short under the parallel
        # suite (a container whose every process was killed still read as running), so ask for
        # up to DEATH_NOTICE_SECONDS.
        give_up = time.monotonic() + DEATH_NOTICE_SECONDS
        while True:
            try:
                state = self.api.inspect_container(self.container_id).get("State") or {}
            except NotFound:  # it died and the engine removed it (AutoRemove): its events still tell how
                state = self._removed_state()
            except DockerException:
                return
            if not state.get("Running") or time.monotonic() >= give_up:
                break
            time.sleep(0.1)
        if not state.get("Running"):
            why = " (out of memory: OOM-killed)" if state.get("OOMKilled") else ""
            raise SandboxError(f"sandbox container {self.container_id[:12]} has stopped{why}: "
                               f"status {state.get('Status')}, exit code {state.get('ExitCode')}")

    def _removed_state(self) -> dict[str, Any]:
        """What inspect would have said of this container before the engine removed it: its `die`
        event's exit code, and whether the memory limit killed anything in it (an `oom` event,
        what the engine's OOMKilled flag is set from). The engine keeps its recent events."""
        state: dict[str, Any] = {"Status": "removed", "Running": False}
        # A loaded engine can have removed the container before its `die` event is readable:
        # asked again for a moment, rather than telling the model "exit code None".
        for _ in range(REMOVED_EVENT_TRIES):
            try:
                for event in self.api.events(since=self._made_at, until=f"{time.time() + 0.5:.6f}",
                                             filters={"container": self.container_id}, decode=True):
                    action = event.get("Action") or event.get("status")
                    if action == "oom":
                        state["OOMKilled"] = True
                    elif action == "die":
                        state["ExitCode"] = (event.get("Actor") or {}).get("Attributes", {}).get("exitCode")
            except (DockerException, OSError):
                break  # the exit is still reported, without its cause
            if state.get("ExitCode") is not None:
                break
        return state

    def _kill(self, target: str) -> None:
        """Kill a process group ("-PGID") or a pid inside the container; best effort, retried:
        a command that filled the pids limit can leave no room for `kill` for a moment.
        An exec of its own: the channel is busy with the very command to kill."""
        why: object = None
        # With the settings' time limit: under gVisor a container whose pids limit a fork bomb
        # filled can leave the kill's exec unanswered, and the shared client's 120 s a try, five
        # tries, held the prompt past the suite's 600 s.
        api = self.lifecycle_api()
        for _ in range(5):
            try:
                ex = api.exec_create(self.container_id, KILL + [target], user=self.settings.user)
                out = api.exec_start(ex["Id"]) or b""
                if api.exec_inspect(ex["Id"]).get("ExitCode") == 0 or b"No such process" in out:
                    return
                why = out.decode("utf-8", "replace").strip()
            except (DockerException, requests.exceptions.RequestException) as e:
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
        out: Outcome | None = None
        for _ in range(2):  # a second time only when the channel's shell was gone before the command began
            with self._link.using() as chan:
                if chan is None:
                    break
                line = request(nonce, "x", fmt_seconds(limit), args=(workdir, command))
                try:
                    chan.send(line, deadline)
                except OSError:
                    self._link.drop(chan)
                    continue
                out, exec_id = self._read_output(chan.frames, nonce, deadline, cap, f"\n{nonce} s\n".encode()), chan.exec_id
                if out.end is None or out.stale > STALE_LIMIT:
                    self._link.drop(chan)
                if out.broke is True and not out.begun:
                    out = None
                    continue
                break
        if out is None:  # channel.WRAPPER, not a copy: the one the channel's script is made of
            exec_id, frames = self.exec_socket(["sh", "-c", channel.WRAPPER, "hermes-exec", nonce, fmt_seconds(limit),
                                                workdir, command])
            try:
                with self._lock:
                    if self._closed:
                        raise SandboxError("sandbox is closed")
                    self._streams.add(frames)
                out = self._read_output(frames, nonce, deadline, cap, None)
            finally:
                with self._lock:
                    self._streams.discard(frames)
                frames.close()
            if isinstance(out.broke, OSError):
                raise SandboxError(f"exec stream broke: {out.broke}") from out.broke
        # the channel is free again: _why_killed may use it
        return finish(out, cap, limit, started, exit_code_of=lambda: self._exit_code(exec_id), why_killed=self._why_killed)

    def _read_output(self, frames: Frames, nonce: str, deadline: float, cap: OutputCap, begin: bytes | None) -> Outcome:
        return read_output(frames, nonce, deadline, cap, begin, kill=self._kill, raise_if_dead=self.raise_if_dead)

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

    def _plain(self, cmd: list[str], data: bytes | None, timeout: float) -> tuple[bytes, bytes, int]:
        exec_id, frames = self.exec_socket(cmd, stdin=data is not None)
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

    def read_file(self, path: str) -> bytes:
        return self._stopped_run_wins(self._read_file, path)

    def _file_request(self, make: Any, timeout: float) -> tuple[int, bytes] | None:
        """(exit code, payload) of one file request over the channel; None: no channel, use an exec."""
        for attempt in range(2):
            with self._link.using() as chan:
                if chan is None:
                    return None
                nonce = secrets.token_hex(8)
                try:
                    return self._link.request(chan, make(nonce), nonce, time.monotonic() + timeout)
                except ChannelLost:
                    if attempt:
                        raise
        return None

    def write_file(self, path: str, data: bytes) -> None:
        self._stopped_run_wins(self._write_file, path, data)
