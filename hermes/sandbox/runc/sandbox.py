"""RuncSandbox: one prompt's sandbox run by runc directly, without the Docker engine.

Opening it is one `runc run --detach` of a bundle (spec.py) over the image's shared root
(rootfs.py), whose init process (PID 1) is the docker backend's command channel script
(channel.SERVER) reading requests from a pipe this process holds (pipes.py): a command or
file operation costs no process start on the host. A call that cannot have the channel (a
concurrent one, or after a request did not end cleanly) gets a `runc exec` of its own running
the same wrapper texts. A flood's or a time-out's kill is done from the host, on the command's
process group found in the sandbox's cgroup. This process's reaper (reaper.py) is told of it:
it removes the sandbox past spec.deadline(), and at once when this process dies. close()
removes it: its processes, its cgroup, runc's state, its folder (state.py).
"""
from __future__ import annotations

import json
import logging
import os
import re
import secrets
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

from hermes.sandbox import lifecycle
from hermes.sandbox.base import EngineTimeout, ExecResult, OutputCap, SandboxError, SandboxSettings, SandboxSpec, resolve_cwd
from hermes.sandbox.docker import channel
from hermes.sandbox.docker.channel import STALE_LIMIT, fmt_seconds, request
from hermes.sandbox.docker.output import Outcome, finish, read_output
from hermes.sandbox.docker.files import ChannelFiles
from hermes.sandbox.docker.sandbox import HOST_GRACE
from hermes.sandbox.runc import reaper, state
from hermes.sandbox.docker.link import hello
from hermes.sandbox.pacing import pacer
from hermes.sandbox.runc.pipes import InitLink, PipeChannel, PipeFrames
from hermes.sandbox.runc.rootfs import image_root
from hermes.sandbox.runc.spec import build_spec, parse_user
from hermes.sandbox.signals import fresh_signals

log = logging.getLogger(__name__)

#: seconds `runc run` (and the channel's greeting) may take
START_TIMEOUT = 30.0
MAX_READ_BYTES = 256 << 20


def wait_exit(proc: subprocess.Popen, timeout: float) -> int:
    """proc's exit code, woken the moment it exits: Popen.wait(timeout) polls with sleeps that
    grow to 50 ms, which added about 10 ms to every `runc run` of 20 (measured with cProfile)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # before Linux 5.3
        return proc.wait(timeout)
    try:
        if not select.select([fd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(fd)
    return proc.wait()


class RuncSandbox(ChannelFiles):
    def __init__(self, spec: SandboxSpec, settings: SandboxSettings, seccomp: dict | None):
        self.spec = spec
        self.settings = settings
        self.cwd = resolve_cwd(spec.cwd, settings.workdir)
        self.uid, self.gid = parse_user(settings.user)
        self.name = state.new_name(spec)
        self.box = state.BOXES / self.name
        self._closed = False
        self._lock = threading.Lock()
        self._oom_seen = 0
        self._init: subprocess.Popen | None = None
        self._start(seccomp)

    @property
    def command_timeout(self) -> float:
        return self.settings.command_timeout

    @property
    def id(self) -> str:
        return self.name

    # -- life -----------------------------------------------------------------

    def _start(self, seccomp: dict | None) -> None:
        run = self.spec.run_label()
        lifecycle.raise_if_stopping(run)
        root = image_root(self.spec.image, self.settings)
        text = channel.server_text()
        hostname = f"hermes-{self.name[-6:]}"  # the name's random part
        etc = {"/etc/hostname": str(self.box / "hostname"), "/etc/hosts": str(self.box / "hosts")}
        config = build_spec(root, self.settings, self.cwd, ["sh", "-c", channel.BOOT.format(n=len(text)), "hermes-channel"],
                            hostname=hostname, cgroup=state.cgroup_path(self.name), seccomp=seccomp, etc_files=etc)
        with lifecycle.creating(run):
            state.BOXES.mkdir(parents=True, exist_ok=True)
            self.box.mkdir(mode=0o700)
            state.write_owner(self.box, self.spec)
            (self.box / "hostname").write_text(hostname + "\n")
            (self.box / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                                            f"127.0.1.1\t{hostname}\n")
            (self.box / "config.json").write_text(json.dumps(config))
            state.removals.opened(self.name, run)
            try:
                # The start (runc run, the channel's greeting) is paced like the docker backend's
                # creates: runc's starts share the host's CPUs, and past a few at once only wait.
                s = self.settings
                gate = pacer("runc", s.engine_concurrency, s.engine_pacing == "adaptive", unit="sandbox starts")
                with gate.slot(f"start of runc sandbox {self.name}", s.engine_timeout):
                    self._run_init()
                    self._watch_lifetime()
                    chan = PipeChannel(self._init.stdin.fileno(), PipeFrames(self._init.stdout.fileno(),
                                                                            self._init.stderr.fileno(), self._usable))
                    chan.pid = hello(chan, text, time.monotonic() + START_TIMEOUT)
            except BaseException:
                self.close()
                raise
            self._link = InitLink(self, chan)
            if lifecycle.stopping(run):
                self.close()
                raise lifecycle.RunInterrupted(f"run {run} is stopping")

    def _run_init(self) -> None:
        """`runc run --detach`: runc hands its stdin, stdout and stderr to the init and exits."""
        self._init = subprocess.Popen(["runc", "--root", str(state.RUNC_ROOT), "run", "--detach", "--bundle",
                                       str(self.box), self.name],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      start_new_session=True, **fresh_signals())
        try:
            code = wait_exit(self._init, START_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            raise EngineTimeout(f"runc run of {self.name} did not finish within {START_TIMEOUT:g}s") from e
        if code != 0:
            os.set_blocking(self._init.stderr.fileno(), False)
            try:
                why = (self._init.stderr.read() or b"").decode("utf-8", "replace").strip()
            except OSError:
                why = ""
            raise SandboxError(f"cannot start a runc sandbox from {self.spec.image}: {why[-500:] or f'exit {code}'}")

    def _watch_lifetime(self) -> None:
        """Tell this process's reaper: it removes the sandbox past its deadline, or at once if we die."""
        found = reaper.reaper(str(state.RUNC_ROOT), str(state.BOXES))
        if found is not None:
            deadline = self.spec.deadline()
            found.track(self.name, None if deadline is None else time.time() + deadline)

    def _usable(self) -> bool:
        return not self._closed

    def warm(self) -> None:
        """Nothing to get ready: the channel is the init, greeted when the sandbox opened."""

    def check_usable(self) -> None:
        lifecycle.raise_if_stopping(self.spec.run_label())
        if self._closed:
            raise SandboxError("sandbox is closed")

    def close(self, wait: bool = True) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if getattr(self, "_link", None) is not None:
            self._link.close()
        state.removals.closed(self.name, wait)
        if self._init is not None:
            for f in (self._init.stdin, self._init.stdout, self._init.stderr):
                try:
                    f.close()
                except OSError:
                    pass

    def __enter__(self) -> "RuncSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RuncSandbox({self.spec.image!r}, name={self.name}, cwd={self.cwd!r})"

    # -- the host's view of it -----------------------------------------------

    def _cgroup_file(self, *names: str) -> Path | None:
        for d in state.cgroup_dirs(self.name):
            for n in names:
                if (d / n).exists():
                    return d / n
        return None

    def _kill(self, target: str) -> None:
        """Kill a process group ("-PGID") or pid as the sandbox numbers them: found among the
        cgroup's processes by their NSpgid / NSpid (the last number: the sandbox's own)."""
        group, number = target.startswith("-"), target.lstrip("-")
        killed: list[str] = []
        procs = self._cgroup_file("cgroup.procs")
        try:
            pids = procs.read_text().split() if procs else []
        except OSError:
            pids = []
        for pid in pids:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            m = re.search(rf"^{'NSpgid' if group else 'NSpid'}:\s*(.*)$", status, re.M)
            if m and m.group(1).split()[-1:] == [number]:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(pid)
                except (ProcessLookupError, PermissionError):
                    pass
        _until_dead(killed)

    def raise_if_dead(self) -> None:
        try:
            status = state.runc("state", self.name, timeout=10).stdout.decode()
        except (OSError, subprocess.TimeoutExpired):
            return
        m = re.search(r'"status":\s*"(\w+)"', status)
        if m and m.group(1) in ("running", "created", "paused"):
            return
        kills = self._oom_kills()
        why = " (out of memory: OOM-killed)" if kills else ""
        raise SandboxError(f"sandbox {self.name} has stopped{why}: status {m.group(1) if m else 'removed'}")

    def _oom_kills(self) -> int | None:
        f = self._cgroup_file("memory.events", "memory.oom_control")
        try:
            m = re.search(r"^oom_kill (\d+)", f.read_text(), re.M) if f else None
        except OSError:
            return None
        return int(m.group(1)) if m else None

    def _why_killed(self) -> str:
        kills = self._oom_kills()
        if kills is None:
            return "[killed by signal 9 (SIGKILL); the sandbox may be out of memory]"
        seen, self._oom_seen = self._oom_seen, max(self._oom_seen, kills)
        if kills > seen:
            return f"[killed: the sandbox ran out of memory (limit {self.settings.memory}); its largest process was killed]"
        return "[killed by signal 9 (SIGKILL)]"

    def _exec_proc(self, argv: list[str], stdin: bool = False) -> subprocess.Popen:
        self.check_usable()
        return subprocess.Popen(["runc", "--root", str(state.RUNC_ROOT), "exec", "--user", f"{self.uid}:{self.gid}",
                                 "--cwd", "/tmp", self.name, *argv],
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, **fresh_signals())

    # -- commands -------------------------------------------------------------

    def _stopped_run_wins(self, fn, *args):
        """A sandbox failing because its run is being stopped ends the prompt (RunInterrupted),
        instead of handing the model a broken tool result; a file's own error is the model's."""
        try:
            return fn(*args)
        except (SandboxError, OSError) as e:
            if not isinstance(e, (FileNotFoundError, IsADirectoryError, PermissionError)):
                lifecycle.raise_if_stopping(self.spec.run_label())
            raise

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
        proc: subprocess.Popen | None = None
        with self._link.using() as chan:
            if chan is not None:
                line = request(nonce, "x", fmt_seconds(limit), args=(workdir, command))
                try:
                    chan.send(line, deadline)
                    out = self._read(chan.frames, nonce, deadline, cap, f"\n{nonce} s\n".encode())
                    if out.end is None or out.stale > STALE_LIMIT:
                        self._link.drop(chan)
                    if out.broke is True and not out.begun:
                        out = None
                except OSError:
                    self._link.drop(chan)
        if out is None:
            proc = self._exec_proc(["sh", "-c", channel.WRAPPER, "hermes-exec", nonce, fmt_seconds(limit), workdir, command])
            frames = PipeFrames(proc.stdout.fileno(), proc.stderr.fileno(), self._usable)
            try:
                out = self._read(frames, nonce, deadline, cap, None)
            finally:
                frames.close()
                proc.stdout.close()
                proc.stderr.close()
            if isinstance(out.broke, OSError):
                raise SandboxError(f"exec stream broke: {out.broke}") from out.broke

        def exit_code() -> int:
            if proc is None:
                return -1
            try:
                return proc.wait(2)
            except subprocess.TimeoutExpired:
                return -1

        if out.target and (out.end is None or out.end[0] >= 128):
            # Its wrapper died (kill -9 -1 spares only PID 1 and the killer): what is left of the
            # command has no timer any more, so it goes now, as the docker backend's container would.
            self._kill(out.target)
        result = finish(out, cap, limit, started, exit_code_of=exit_code, why_killed=self._why_killed)
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(HOST_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return result

    def _read(self, frames: PipeFrames, nonce: str, deadline: float, cap: OutputCap, begin: bytes | None) -> Outcome:
        return read_output(frames, nonce, deadline, cap, begin, kill=self._kill, raise_if_dead=self.raise_if_dead)

    # -- files ----------------------------------------------------------------

    def _file_request(self, make, timeout: float) -> tuple[int, bytes] | None:
        with self._link.using() as chan:
            if chan is None:
                return None
            nonce = secrets.token_hex(8)
            return self._link.request(chan, make(nonce), nonce, time.monotonic() + timeout)

    def _plain(self, argv: list[str], data: bytes | None, timeout: float) -> tuple[bytes, bytes, int]:
        proc = self._exec_proc(argv, stdin=data is not None)
        try:
            out, err = proc.communicate(data, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            proc.kill()
            proc.communicate()
            raise SandboxError(f"file operation did not finish within {timeout:g}s") from e
        if len(out) > MAX_READ_BYTES:
            raise SandboxError(f"file larger than {MAX_READ_BYTES} bytes")
        return out, err, proc.returncode

    def read_file(self, path: str) -> bytes:
        return self._stopped_run_wins(self._read_file, path)

    def write_file(self, path: str, data: bytes) -> None:
        self._stopped_run_wins(self._write_file, path, data)


def _until_dead(pids: list[str], within: float = 2.0) -> None:
    """Wait (a little) until SIGKILLed processes are dead: a signal is delivered when the process
    next runs, and on a busy machine a `ps` right after a time limit still listed the command."""
    deadline = time.monotonic() + within
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                break  # gone (reaped)
            if stat.rsplit(")", 1)[-1].split()[:1] in (["Z"], ["X"]):
                break  # dead, not yet reaped: no longer running, and `ps` shows no command line
            time.sleep(0.005)

