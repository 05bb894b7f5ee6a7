"""LocalSandbox: model commands run directly on THIS HOST. It is NOT a security boundary.

Used only when a user explicitly opts in (settings.backend == "local"), e.g. on a machine
without Docker. What it gives: a temporary folder as the work space (removed on close; if its
process dies, by a small watcher process at once, else by the next run's start; see work_root
for where), a
row's cwd mapped *inside* that folder (never the real host path), commands run with
`/bin/sh -c` (plain words without it, as the shell would run them: plain_words) in a session
of their own with a reduced environment (no host secrets such as
API keys), killed with their whole process group at the time limit, and the same output
cap as the docker backend. What it does not give: any isolation. A command can read and
write anything the host user can, reach the network, and leave processes behind if they
escape their process group. Paths given to read_file/write_file are mapped into the
temporary folder (absolute ones too); paths inside commands are the host's.
"""
from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from hermes.sandbox.base import (ExecResult, Leftover, OutputCap, Sandbox, SandboxError, SandboxSettings, SandboxSpec,
                                 resolve_cwd)
from hermes.sandbox.lifecycle import owner_alive
from hermes.sandbox.registry import SandboxBackend, register
from hermes.sandbox.signals import fresh_signals

log = logging.getLogger(__name__)

#: how long output is still collected after the command exited (background children may hold the pipe)
DRAIN_SECONDS = 0.2
MAX_READ_BYTES = 256 << 20
_warned = threading.Event()


def work_root(settings: SandboxSettings) -> Path:
    """Where the sandboxes' folders are made: settings.local_dir, else the temporary folder.

    Not a tmpfs by default, though a container's work space is one: on this project's machines
    (/tmp on ext4 without a journal, where mkdir checks each new inode against the recently
    deleted ones) /dev/shm took 5% off a 512-in-flight run's CPU, but its throughput moved +3%
    or -3% with how the run and the model server shared the scheduler (bench/THROUGHPUT.md,
    session 10), and a model's big files would sit in memory."""
    if settings.local_dir:
        root = Path(settings.local_dir).expanduser()
        root.mkdir(parents=True, exist_ok=True)
        return root
    return Path(tempfile.gettempdir())


#: a command of plain words only: nothing the shell would expand, split, redirect or join
_PLAIN = re.compile(r"[A-Za-z0-9_./:=,+@%-]+(?: +[A-Za-z0-9_./:=,+@%-]+)*")
#: first words the shell runs itself (dash's builtins and reserved words): these need it
_SHELL_OWN = frozenset(
    ". : [ alias bg break cd chdir command continue echo eval exec exit export false fc fg getopts hash jobs kill "
    "local printf pwd read readonly return set shift test times trap true type ulimit umask unalias unset wait "
    "! case do done elif else esac fi for if in then until while { }".split())


def plain_words(command: str) -> list[str] | None:
    """The words of a command the shell would only look up in PATH and run (`ls -la`,
    `python3 main.py`, `cat /etc/hostname`), else None. Such a command is run without
    `/bin/sh -c`: the shell's own start cost about 1 ms of CPU, as much as the command's
    (bench/THROUGHPUT.md, session 11), and it would exec the command in its place anyway. The
    environment gets PWD, which the shell would have set. Anything with a quote, `$`, a glob, a
    redirection, a separator, an assignment, a builtin or a newline goes to the shell."""
    stripped = command.strip(" ")
    if not _PLAIN.fullmatch(stripped):
        return None
    words = stripped.split()
    if words[0] in _SHELL_OWN or "=" in words[0]:
        return None
    return words


@functools.lru_cache(maxsize=1)
def _host_tag() -> str:
    """How this host's folder names begin; the making process's pid follows, so that a dead
    one's folders can be told (LocalBackend.leftovers)."""
    return "hermes-local-" + (re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:40] or "host") + "-"


_reapers: dict[tuple[int, str], tuple[subprocess.Popen, int]] = {}
_reapers_lock = threading.Lock()


def _watch_over(root: Path) -> None:
    """Have this process's folders in `root` removed when it ends, however it ends.

    One small process per (process, root), in a session of its own (a kill of the run's process
    group leaves it be), waits for the end of a pipe only this process writes to: the kernel
    closes it when this process dies, SIGKILL included, and the watcher then removes the folders
    named after this process. So a killed run's folders go even if no run comes after it; a
    normal end removed them already and the watcher finds none."""
    key = (os.getpid(), str(root))
    with _reapers_lock:
        if key in _reapers:
            return
        read_end, write_end = os.pipe()  # neither is inherited by the commands (close_fds)
        try:
            watcher = subprocess.Popen(["sh", "-c", 'cat >/dev/null; rm -rf -- "$0"/"$1"*', str(root),
                                        f"{_host_tag()}{os.getpid()}-"], stdin=read_end,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       start_new_session=True)
        except OSError:  # no sh: the next run's start sweeps them (LocalBackend.leftovers)
            os.close(write_end)
            return
        finally:
            os.close(read_end)
        _reapers[key] = (watcher, write_end)


class LocalSandbox:
    def __init__(self, spec: SandboxSpec, settings: SandboxSettings):
        if not _warned.is_set():
            _warned.set()
            log.warning("LOCAL SANDBOX: model-written commands run on this host WITHOUT isolation "
                        "(settings.backend='local')")
        self.spec = spec
        self.settings = settings
        root = work_root(settings)
        _watch_over(root)
        self.root = Path(tempfile.mkdtemp(prefix=f"{_host_tag()}{os.getpid()}-", dir=root)).resolve()
        self.cwd = resolve_cwd(spec.cwd, settings.workdir)  # as the model sees it
        self._groups: set[int] = set()
        self._closed = False
        self._lock = threading.Lock()
        (self.root / "tmp").mkdir(exist_ok=True)
        self._map(self.cwd).mkdir(parents=True, exist_ok=True)

    @property
    def command_timeout(self) -> float:
        return self.settings.command_timeout

    def host_path(self, path: str | None = None) -> Path:
        """Where a sandbox path lives on the host (inside the temporary folder)."""
        return self._map(path or self.cwd)

    def _map(self, path: str) -> Path:
        return self._resolve(path)[0]

    def _resolve(self, path: str) -> tuple[Path, Path]:
        """(where the path is on the host, that place with its symlinks resolved)."""
        virtual = resolve_cwd(path, self.cwd)  # normalised: no '..' can climb above /
        host = self.root / virtual.lstrip("/")
        real = Path(os.path.realpath(host))
        if real != self.root and self.root not in real.parents:
            raise PermissionError(f"{path} leads outside the sandbox folder")
        return host, real

    def _env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
               "HOME": str(self.root / "tmp"), "TMPDIR": str(self.root / "tmp"),
               "HERMES_SANDBOX_ROOT": str(self.root)}
        for k in ("LANG", "LC_ALL", "TZ"):
            if k in os.environ:
                env[k] = os.environ[k]
        return env

    # -- commands -------------------------------------------------------------

    def exec(self, command: str, *, cwd: str | None = None, timeout: float | None = None) -> ExecResult:
        if self._closed:
            raise SandboxError("sandbox is closed")
        started = time.monotonic()
        limit = self.settings.command_timeout if timeout is None else float(timeout)
        cap = OutputCap(self.settings.output_limit)
        try:
            workdir, real_workdir = self._resolve(resolve_cwd(cwd, self.cwd))
            workdir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return ExecResult(126, f"cannot enter working directory {cwd}: {e}\n", duration=time.monotonic() - started)
        proc = None
        words = plain_words(command)
        if words:
            try:  # as the shell would run it, without the shell (dash's own start is half of it)
                proc = self._start(words, workdir, {**self._env(), "PWD": str(real_workdir)})
            except OSError:
                pass  # not found, not runnable, a script without #!: the shell says so, or runs it
        if proc is None:
            try:
                proc = self._start(["/bin/sh", "-c", command], workdir, self._env())
            except OSError as e:
                raise SandboxError(f"cannot start /bin/sh: {e}") from e
        self._groups.add(proc.pid)
        timed_out = flood_killed = False
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        deadline = started + limit
        exited_at: float | None = None
        try:
            while True:
                now = time.monotonic()
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at > DRAIN_SECONDS:
                    break
                if exited_at is None and now >= deadline:
                    timed_out = True
                    self._killpg(proc.pid)
                    proc.wait()
                    exited_at = time.monotonic()
                    continue
                wait = min(0.05, max(0.0, deadline - now)) if exited_at is None else 0.02
                if not sel.select(wait):
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    if exited_at is None:
                        proc.wait(timeout=max(0.0, deadline - time.monotonic()) + 0.1)
                    break
                cap.feed(chunk)
                if cap.flooded and not flood_killed:
                    flood_killed = True
                    self._killpg(proc.pid)
        except subprocess.TimeoutExpired:
            timed_out = True
            self._killpg(proc.pid)
        finally:
            sel.close()
            proc.stdout.close()
        code = proc.wait()
        text, truncated = cap.result()
        if flood_killed:
            text += f"\n[command killed: it kept writing output ({cap.total} bytes)]"
        return ExecResult(exit_code=-1 if (timed_out or flood_killed) else code, output=text,
                          timed_out=timed_out, truncated=truncated, duration=time.monotonic() - started)

    @staticmethod
    def _start(argv: list[str], workdir: Path, env: dict[str, str]) -> subprocess.Popen:
        """argv in a session of its own: its process group is what a time limit kills."""
        return subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, **fresh_signals())

    def _killpg(self, pgid: int) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    # -- files ----------------------------------------------------------------

    def read_file(self, path: str) -> bytes:
        host = self._map(path)
        if host.is_file() and host.stat().st_size > MAX_READ_BYTES:
            raise SandboxError(f"{path}: file larger than {MAX_READ_BYTES} bytes")
        return host.read_bytes()  # FileNotFoundError / IsADirectoryError / PermissionError as is

    def write_file(self, path: str, data: bytes) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8")
        host = self._map(path)
        host.parent.mkdir(parents=True, exist_ok=True)
        self._map(path)  # re-check: a parent could be a symlink leading out
        host.write_bytes(data)

    # -- life -----------------------------------------------------------------

    def warm(self) -> None:
        """Nothing to get ready: the folder exists from the start."""

    def close(self, wait: bool = True) -> None:
        """Kill what is left of its commands now and remove the folder: before returning, or
        with `wait=False` in the background (the backend's drain() waits for that)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for pgid in list(self._groups):
            self._killpg(pgid)
        if wait:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            removals.put(self.root)

    def __enter__(self) -> "LocalSandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalSandbox(root={str(self.root)!r}, cwd={self.cwd!r})"


class _Removals:
    """Folders of sandboxes closed with wait=False, removed in the background: a prompt's worker
    slot is free before its files are gone. One thread removes whatever is queued when it gets
    to it with one `rm -rf` (shutil.rmtree's calls, a dozen a folder, each took the interpreter
    lock back from hundreds of prompts in flight). The executor's thread finishes what is queued
    before the interpreter exits."""

    #: folders to one `rm` (its arguments stay far below the kernel's limit)
    CHUNK = 256

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="local-sandbox-removal")
        self._lock = threading.Lock()
        self._queued: list[Path] = []
        self._pending: set[concurrent.futures.Future] = set()

    def put(self, root: Path) -> None:
        with self._lock:
            self._queued.append(root)
            if len(self._queued) > 1:
                return  # a removal is already due to take the queue, this one included
            future = self._pool.submit(self._remove_queued)
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _remove_queued(self) -> None:
        with self._lock:
            roots, self._queued = self._queued, []
        for i in range(0, len(roots), self.CHUNK):
            chunk = roots[i:i + self.CHUNK]
            try:
                removed = subprocess.run(["rm", "-rf", "--", *map(str, chunk)], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
            except OSError:  # no rm to run
                removed = False
            if not removed:
                for root in chunk:
                    shutil.rmtree(root, ignore_errors=True)

    def _done(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._pending.discard(future)

    def drain(self, timeout: float | None) -> bool:
        """Wait until every folder handed over is gone; False if some are left after `timeout` s."""
        with self._lock:
            pending = list(self._pending)
        return not concurrent.futures.wait(pending, timeout).not_done


removals = _Removals()


@register
class LocalBackend(SandboxBackend):
    """Commands on this host, in a temporary folder per prompt. Nothing outlives the process
    but what its commands leave; folders closed in the background are waited for by drain()."""

    name = "local"
    slow_to_open = False  # a temporary folder

    def image_known(self, image: str) -> bool:
        return True  # no images: commands run on this host

    def open(self, spec: SandboxSpec) -> Sandbox:
        return LocalSandbox(spec, self.settings)

    def drain(self, timeout: float | None = 60.0) -> bool:
        return removals.drain(timeout)

    def leftovers(self, run_id: str | None = None, *, label: str | None = None) -> list[Leftover]:
        """This user's folders of this host's processes in work_root, each with whether its maker
        lives. A folder names no run and carries no label: with `label` none is found; with
        `run_id` only those whose maker is dead (whatever run it served, nothing uses them)."""
        if label is not None:
            return []
        host_part, host = _host_tag(), socket.gethostname()
        found = []
        try:
            entries = list(os.scandir(work_root(self.settings)))
        except OSError:
            return []
        for entry in entries:
            pid = entry.name[len(host_part):].split("-", 1)[0]
            if not entry.name.startswith(host_part) or not pid.isdigit():
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not entry.is_dir(follow_symlinks=False) or info.st_uid != os.getuid():
                continue
            owner = f"{host}:{pid}"
            alive = bool(owner_alive(owner, info.st_mtime))  # a pid reused since is not its maker
            if run_id is None or not alive:
                found.append(Leftover(id=entry.path, name=entry.name, run="", owner=owner, alive=alive))
        return found

    def remove(self, found: list[Leftover]) -> int:
        for leftover in found:
            shutil.rmtree(leftover.id, ignore_errors=True)
        return sum(not os.path.lexists(leftover.id) for leftover in found)
