"""DockerSandbox: one hardened container per prompt, on the docker SDK.

Every container gets, unless the settings say otherwise: no network, every capability
dropped, no-new-privileges, a non-root user, memory (no extra swap), CPU and pids limits,
a read-only root with size-capped tmpfs work space at /tmp, at the work dir, at the row's
cwd and over the image's VOLUMEs, /dev/shm capped the same, an init process as PID 1, and
labels naming the run, the prompt and the owner process. It is kept alive by `sleep` and
removed (force) by `close()`, at interpreter exit, when its run is interrupted (see
lifecycle.RunGuard), or by `cleanup()` once its owner is dead. `limit_problems()` says
which limits the engine would not apply, before a run starts.

Commands run as `sh -c` under a small POSIX-sh wrapper that starts the command in a
session of its own (`setsid`) next to a timer that kills that whole process group at the
time limit; the host also bounds its wait. Output (stdout and stderr merged, in order) is
capped; an endless flood of output gets the command killed; a command killed by the
memory limit is told so. The wrapper prints an end marker after the command, so a command
that leaves a background process holding its output returns at once instead of waiting for
the engine's I/O grace period.

Engine work per sandbox is the machine's bare unit: create, start, ONE exec, remove. That exec
is a command channel (see _SERVER): a small `sh` loop taking framed requests (run a command
under the wrapper above, read a file, write a file) on its stdin, so a tool call costs no
engine round trip; a call that cannot have it gets an exec of its own, as all calls once did.
Creates, starts and removes pass a process-wide gate (settings.engine_concurrency) with a time
limit (settings.engine_timeout). close(wait=False) leaves the removal to background threads;
drain_removals() waits for them, and exit removes whatever is left.
"""
from __future__ import annotations

import atexit
import base64
import contextlib
import errno
import logging
import queue
import re
import secrets
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from hermes.sandbox import lifecycle
from hermes.sandbox.base import (
    LABEL_OWNER,
    LABEL_PROMPT,
    LABEL_RUN,
    EngineTimeout,
    ExecResult,
    ImageUnavailable,
    OutputCap,
    SandboxError,
    SandboxSettings,
    SandboxSpec,
    resolve_cwd,
)

log = logging.getLogger(__name__)

#: the harmless command that keeps a sandbox container alive (busybox and coreutils alike)
KEEPALIVE = ["sleep", "2147483647"]
#: extra seconds the host waits beyond a command's own time limit before giving up on it
HOST_GRACE = 5.0
#: read_file refuses files larger than this
MAX_READ_BYTES = 256 << 20

# --------------------------------------------------------------------------- the client


_client_lock = threading.Lock()
_client: docker.DockerClient | None = None


def get_client() -> docker.DockerClient:
    """The process-wide docker client (DOCKER_HOST etc. from the environment)."""
    global _client
    with _client_lock:
        if _client is None:
            try:
                client = docker.from_env(timeout=120, max_pool_size=128)
                client.ping()
            except DockerException as e:
                raise SandboxError(f"no Docker engine answers: {e}") from e
            _client = client
        return _client


class _Gate:
    """Bounds the container creates, starts and removes in flight at the engine, process-wide.

    dockerd gets slower, not faster, with more of them at once (a bare sandbox lives ~0.5 s at
    4 in flight, ~8 s at 64, for the same throughput) and deadlocked here at 64: past a handful,
    concurrency only queues inside the engine. Waiting here for a slot is bounded too, so a
    stuck engine fails prompts instead of piling them up.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.busy = 0
        self._cond = threading.Condition()

    def resize(self, limit: int) -> None:
        with self._cond:
            if limit != self.limit:
                self.limit = limit
                self._cond.notify_all()

    @contextlib.contextmanager
    def slot(self, what: str, timeout: float) -> Iterator[None]:
        with self._cond:
            if not self._cond.wait_for(lambda: self.busy < self.limit, timeout):
                raise EngineTimeout(f"Docker engine too slow: {what} waited {timeout:g}s behind "
                                    f"{self.busy} container operations in flight")
            self.busy += 1
        try:
            yield
        finally:
            with self._cond:
                self.busy -= 1
                self._cond.notify()


_gate = _Gate(SandboxSettings().engine_concurrency)


@contextlib.contextmanager
def _engine_call(what: str, settings: SandboxSettings) -> Iterator[None]:
    """One gated engine call; a time-out becomes EngineTimeout (the SDK raises requests' own
    exceptions for it, which are no DockerException)."""
    _gate.resize(settings.engine_concurrency)
    with _gate.slot(what, settings.engine_timeout):
        try:
            yield
        except requests.exceptions.Timeout as e:
            raise EngineTimeout(f"Docker engine did not answer {what} within {settings.engine_timeout:g}s") from e
        except requests.exceptions.ConnectionError as e:
            raise SandboxError(f"Docker engine connection failed during {what}: {e}") from e


_lifecycle_clients: dict[float, docker.DockerClient] = {}


def _lifecycle_client(client: docker.DockerClient, timeout: float) -> docker.DockerClient:
    """A client whose calls give up after `timeout` s: the shared one waits 120 s, which an
    engine call of a prompt should never. Only for the process-wide default client."""
    if client is not _client:
        return client
    with _client_lock:
        found = _lifecycle_clients.get(timeout)
        if found is None:
            try:
                found = docker.from_env(timeout=timeout, max_pool_size=64, version=client.api.api_version)
            except DockerException as e:
                raise SandboxError(f"no Docker engine answers: {e}") from e
            _lifecycle_clients[timeout] = found
        return found


def engine_available() -> bool:
    try:
        get_client()
        return True
    except SandboxError:
        return False


def _key(client: docker.DockerClient) -> str:
    return str(getattr(client.api, "base_url", id(client)))


def _loud(msg: str, *args: Any) -> None:
    log.warning("SANDBOX HARDENING NOT APPLIED: " + msg, *args)


# --------------------------------------------------------------------------- engine capabilities

_engine_lock = threading.Lock()
_engine_problems: dict[str, list[str]] = {}
_seen_warnings: set[str] = set()
_verified: set[tuple[str, str]] = set()


def engine_problems(client: docker.DockerClient | None = None) -> list[str]:
    """What this engine says it cannot enforce (checked once per process, logged loudly)."""
    client = client or get_client()
    key = _key(client)
    with _engine_lock:
        if key in _engine_problems:
            return _engine_problems[key]
        problems: list[str] = []
        try:
            info = client.info()
        except DockerException as e:
            raise SandboxError(f"docker info failed: {e}") from e
        for flag, what in (("MemoryLimit", "memory limit"), ("SwapLimit", "swap limit (memory+swap)"),
                           ("CpuCfsQuota", "CPU limit (CFS quota)"), ("PidsLimit", "pids limit")):
            if info.get(flag) is False:
                problems.append(f"{what}: engine reports {flag}=false")
        if not any("seccomp" in str(o) for o in info.get("SecurityOptions") or []):
            problems.append("seccomp: engine has no seccomp profile")
        for w in info.get("Warnings") or []:
            problems.append(f"engine warning: {w}")
        for p in problems:
            _loud("%s", p)
        _engine_problems[key] = problems
        return problems


def _report_create_warnings(warnings: list[str] | None) -> None:
    for w in warnings or []:
        with _engine_lock:
            if w in _seen_warnings:
                continue
            _seen_warnings.add(w)
        _loud("engine said on container create: %s", w)


def _host_config_problems(hc: dict, settings: SandboxSettings) -> list[str]:
    """What the engine did not apply, read back from a container's HostConfig."""
    expect = {
        "Memory": ("memory limit", lambda v: bool(v)),
        "MemorySwap": ("swap limit (memory+swap)", lambda v: v == hc.get("Memory")),
        "NanoCpus": ("CPU limit", lambda v: v == int(settings.cpus * 1e9)),
        "PidsLimit": ("pids limit", lambda v: v == settings.pids_limit),
        "ReadonlyRootfs": ("read-only root", lambda v: bool(v) == settings.read_only),
        "CapDrop": ("dropped capabilities", lambda v: "ALL" in (v or [])),
        "SecurityOpt": ("no-new-privileges", lambda v: "no-new-privileges" in (v or [])),
        "NetworkMode": ("no network", lambda v: settings.network or v == "none"),
        "Init": ("init process", lambda v: bool(v)),
    }
    return [f"{what}: the container's HostConfig.{field} is {hc.get(field)!r}"
            for field, (what, ok) in expect.items() if not ok(hc.get(field))]


def _verify_host_config(client: docker.DockerClient, cid: str, settings: SandboxSettings) -> None:
    """Once per process and settings: read back what the engine actually applied."""
    key = (_key(client), settings.model_dump_json())
    with _engine_lock:
        if key in _verified:
            return
        _verified.add(key)
    for problem in _host_config_problems(client.api.inspect_container(cid).get("HostConfig") or {}, settings):
        _loud("container %s: %s", cid[:12], problem)


_LIMIT_WORDS = re.compile(r"limit|swap|memory|cpu|pids|cgroup|seccomp|oom", re.I)


def limit_problems(settings: SandboxSettings, image: str | None = None, *, run_id: str | None = None,
                   client: docker.DockerClient | None = None) -> list[str]:
    """Limits this engine would not enforce on a run's containers ([] when all hold).

    The engine's own report, then a probe: one container made (never started) with the
    run's settings, whose create-time warnings and applied HostConfig are read back.
    """
    client = client or get_client()
    problems = [p for p in engine_problems(client) if _LIMIT_WORDS.search(p)]
    for p in _probe(client, settings, image or settings.image, run_id or lifecycle.PROBE_RUN):
        if p not in problems:
            problems.append(p)
    return problems


def _probe(client: docker.DockerClient, settings: SandboxSettings, image: str, run_id: str) -> list[str]:
    try:
        image_cfg = _image_config(image, settings.pull_timeout, client)
    except SandboxError as e:
        log.warning("sandbox limits not probed: %s", e)
        return []
    spec = SandboxSpec(image=image, run_id=run_id, prompt_id="probe")
    args = _container_args(client.api, spec, settings, resolve_cwd(None, settings.workdir), image_cfg)
    try:
        res = client.api.create_container(**args)
    except DockerException as e:
        raise SandboxError(f"cannot make a probe container from {image}: {getattr(e, 'explanation', None) or e}") from e
    try:
        hc = client.api.inspect_container(res["Id"]).get("HostConfig") or {}
        created = [f"engine said on container create: {w}" for w in res.get("Warnings") or []]
        return created + _host_config_problems(hc, settings)
    finally:
        _remove(client, res["Id"])


# --------------------------------------------------------------------------- images

_image_lock = threading.Lock()
_image_key_locks: dict[tuple[str, str], threading.Lock] = {}
_images_ok: dict[tuple[str, str], dict] = {}
_images_failed: dict[tuple[str, str], str] = {}


def ensure_image(*args: Any, pull_timeout: float | None = None, client: docker.DockerClient | None = None) -> str:
    """Make sure an image is here: present locally, else pulled within `pull_timeout` s.

    Call as ``ensure_image(image, pull_timeout=120)`` or ``ensure_image(client, image, pull_timeout)``.
    Cached per process (a failed pull is not retried, a local image is always looked for).
    Raises ImageUnavailable(image, reason).
    """
    rest = list(args)
    if rest and not isinstance(rest[0], str):
        client = rest.pop(0)
    if not rest:
        raise TypeError("ensure_image needs an image name")
    image = rest.pop(0)
    if rest:
        pull_timeout = rest.pop(0)
    _image_config(image, 120.0 if pull_timeout is None else float(pull_timeout), client or get_client())
    return image


def _image_config(image: str, pull_timeout: float, client: docker.DockerClient) -> dict:
    key = (_key(client), image)
    if key in _images_ok:
        return _images_ok[key]
    with _image_lock:
        lock = _image_key_locks.setdefault(key, threading.Lock())
    with lock:
        if key in _images_ok:
            return _images_ok[key]
        try:
            cfg = client.api.inspect_image(image).get("Config") or {}
            _images_ok[key] = cfg
            return cfg
        except ImageNotFound:
            pass
        except DockerException as e:
            raise SandboxError(f"cannot check image {image}: {e}") from e
        if key in _images_failed:
            raise ImageUnavailable(image, _images_failed[key])
        reason = _pull(client, image, pull_timeout)
        if reason is None:
            try:
                cfg = client.api.inspect_image(image).get("Config") or {}
                _images_ok[key] = cfg
                return cfg
            except DockerException as e:
                reason = f"pulled, yet not found: {e}"
        _images_failed[key] = reason
        raise ImageUnavailable(image, reason)


def _pull(client: docker.DockerClient, image: str, timeout: float) -> str | None:
    """None on success, else why not."""
    from docker.utils import parse_repository_tag

    repo, tag = parse_repository_tag(image)
    outcome: list[str | None] = []

    def work() -> None:
        try:
            for msg in client.api.pull(repo, tag=tag or "latest", stream=True, decode=True):
                if isinstance(msg, dict) and msg.get("error"):
                    outcome.append(f"pull failed: {msg['error']}")
                    return
            outcome.append(None)
        except APIError as e:
            outcome.append(f"not present locally; pull failed: {e.explanation or e}")
        except Exception as e:  # noqa: BLE001 - any failure is a reason
            outcome.append(f"not present locally; pull failed: {e}")

    t = threading.Thread(target=work, name=f"pull {image}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return f"not present locally; pull did not finish within {timeout:g}s"
    return outcome[0] if outcome else "pull failed"


# --------------------------------------------------------------------------- cwd policy

# A tmpfs over these would hide the image's own system files: a cwd here is used as is.
_SYSTEM_EXACT = {"/", "/usr", "/usr/local", "/var", "/opt", "/home", "/srv", "/mnt", "/media"}
_SYSTEM_TREES = ("/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                 "/boot", "/run", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64",
                 "/usr/libexec", "/usr/share", "/usr/include", "/usr/local/bin", "/usr/local/sbin",
                 "/usr/local/lib", "/var/lib", "/var/run")


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _tmpfs_plan(cwd: str, settings: SandboxSettings, image_workdir: str,
                volumes: list[str] = ()) -> tuple[list[str], str | None]:
    """(tmpfs mount points, why cwd gets none or None).

    An image's VOLUMEs get a tmpfs too: else each would be a writable host directory of
    unbounded size (their initial content from the image is hidden).
    """
    workdir = resolve_cwd(None, settings.workdir)
    if workdir == "/" or any(_under(workdir, t) for t in _SYSTEM_TREES):
        raise SandboxError(f"settings.workdir {workdir!r} is a system path; choose e.g. /workspace")
    mounts = ["/tmp", workdir] if workdir != "/tmp" else ["/tmp"]
    mounts += [v for v in (resolve_cwd(v, "/") for v in volumes) if v != "/" and v not in mounts]
    if any(_under(cwd, m) for m in mounts):
        return mounts, None
    if cwd in _SYSTEM_EXACT or any(_under(cwd, t) for t in _SYSTEM_TREES):
        return mounts, "it is a system path"
    if image_workdir and resolve_cwd(image_workdir, "/") == cwd:
        return mounts, "it is the image's WORKDIR, whose contents are kept"
    return mounts + [cwd], None


# --------------------------------------------------------------------------- the exec wrapper

# $1 nonce, $2 seconds, $3 cwd, $4 command. fd 3 is the control channel (the exec's stderr);
# the command's stdout and stderr both go to the exec's stdout, in order.
_WRAPPER = r"""exec 3>&2 2>&1
n=$1 t=$2 d=$3 c=$4
cd -- "$d" 2>/dev/null || { mkdir -p -- "$d" 2>/dev/null; cd -- "$d"; } || { printf '\n%s 126 1\n' "$n"; exit 126; }
if command -v setsid >/dev/null 2>&1; then
  setsid sh -c "$c" </dev/null 3>&- &
  p=$!
  echo "$n pgid $p" >&3
  setsid sh -c 'sleep "$1" && kill -9 -"$2"' hermes-timer "$t" "$p" </dev/null >/dev/null 2>&1 3>&- &
  w=$!
  { wait "$p"; } 2>/dev/null; r=$?
  kill -9 "$w" -"$w" 2>/dev/null
else
  sh -c "$c" </dev/null 3>&- &
  p=$!
  echo "$n pid $p" >&3
  ( sleep "$t" && kill -9 "$p" ) </dev/null >/dev/null 2>&1 3>&- &
  w=$!
  { wait "$p"; } 2>/dev/null; r=$?
  kill -9 "$w" 2>/dev/null
fi
{ wait "$w"; } 2>/dev/null; f=$?
printf '\n%s %s %s\n' "$n" "$r" "$f"
"""

# $1 cwd, $2 path: enter cwd, then say why the file cannot be read (exit 3/4/5) or return 0.
_READ_CHECKS = r"""cd -- "$1" 2>/dev/null || { mkdir -p -- "$1" 2>/dev/null && cd -- "$1"; } || cd /
[ -e "$2" ] || { echo "No such file or directory: $2" >&2; exit 3; }
[ -d "$2" ] && { echo "Is a directory: $2" >&2; exit 4; }
[ -r "$2" ] || { echo "Permission denied: $2" >&2; exit 5; }
"""
_READ = _READ_CHECKS + 'exec cat -- "$2"\n'

_WRITE = r"""cd -- "$1" 2>/dev/null || { mkdir -p -- "$1" 2>/dev/null && cd -- "$1"; } || cd /
p=$2
if [ -d "$p" ]; then cat >/dev/null; echo "Is a directory: $p" >&2; exit 4; fi
d=$(dirname -- "$p")
if ! { [ -d "$d" ] || mkdir -p -- "$d"; } 2>&1 >&2; then cat >/dev/null; exit 5; fi
if ! cat > "$p"; then cat >/dev/null; exit 5; fi
"""


# The command channel: one `sh` per container, started once, serving every later command and
# file operation of the sandbox over its exec's stdin/stdout/stderr, so a tool call costs no
# engine round trip. Its text comes over stdin (see _server_text: in argv it would fill every
# `ps` listing), set up with W the exec wrapper, R the read checks, V the write script (the
# texts the per-call path runs); it says "~hermes-channel PID" on stderr when it listens. One request a line on stdin; arguments are base64 (of the
# text plus "."), so no byte of a command or path can end a line or a field:
#   NONCE x SECONDS CWD COMMAND   run a command: "\nNONCE s\n", then the wrapper's own output
#                                 and end marker, on stdout (the command's stdout and stderr)
#   NONCE r CWD PATH              read a file       } answered on stderr, which no command holds:
#   NONCE w CWD PATH SIZE         write a file: SIZE } "~NONCE\n", the payload (base64 of the file,
#                                 raw bytes follow   }  or the error), "\n~NONCE CODE\n"
#   NONCE p "hermes."             ping: can this shell decode its requests?
# The nonce is fresh per request and lives only in this shell's memory (not in any argv or
# environment a command can read), so output can neither fake an answer nor end one early.
# Commands get /dev/null as stdin: the request stream is this shell's alone. A wrapper killed
# from inside (kill $PPID) still gets an end marker, from here.
_SERVER = r"""printf '~hermes-channel %s\n' "$$" >&2
arg() { printf %s "$1" | base64 -d; }
while IFS=' ' read -r n o a b c; do
  case $o in
  x) d=$(arg "$b"); d=${d%.}; e=$(arg "$c"); e=${e%.}
     printf '\n%s s\n' "$n"
     ( set -- "$n" "$a" "$d" "$e"; eval "$W" ) </dev/null
     s=$?; [ "$s" = 0 ] || [ "$s" = 126 ] || printf '\n%s %s 1\n' "$n" "$s" ;;
  r|w) d=$(arg "$a"); d=${d%.}; p=$(arg "$b"); p=${p%.}
     printf '~%s\n' "$n" >&2
     if [ "$o" = r ]; then
       ( set -- "$d" "$p"; eval "$R" && exec base64 <"$p" ) </dev/null >&2 2>&1
     else
       head -c "$c" | ( set -- "$d" "$p"; eval "$V" ) >&2 2>&1
     fi
     printf '\n~%s %s\n' "$n" "$?" >&2 ;;
  p) printf '~%s\n' "$n" >&2
     [ "$(arg "$a")" = hermes. ] && command -v head >/dev/null
     printf '\n~%s %s\n' "$n" "$?" >&2 ;;
  esac
done
"""
#: seconds a new channel may take to answer its first ping before the sandbox does without it
CHANNEL_HELLO_TIMEOUT = 30.0
#: a channel whose stdout carries more than this of earlier commands' background output between
#: requests is left to those jobs and a fresh one opened: their output then cannot spill into
#: every later command's (output printed while a later command runs does show in it, as in a terminal)
STALE_LIMIT = 64 << 10
#: the channel exec's command: reads exactly its script (nothing else is sent before it answers)
_BOOT = 'eval "$(head -c {n})"'


def _server_text() -> bytes:
    """The channel's script with the current wrapper texts in it (read at each opening)."""
    import shlex

    defs = f"W={shlex.quote(_WRAPPER)}\nR={shlex.quote(_READ_CHECKS)}\nV={shlex.quote(_WRITE)}\n"
    return (defs + _SERVER).encode()


def _arg(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", "surrogateescape") + b".").decode("ascii")

def _fmt_seconds(t: float) -> str:
    return f"{max(t, 0.01):.3f}".rstrip("0").rstrip(".")


def _slug(s: str, n: int) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", s).strip("-.")[:n] or "x"


class _Frames:
    """Reads the engine's multiplexed exec stream: (stream number, payload) pairs."""

    def __init__(self, sock: Any):
        self.io = sock
        self.raw: socket.socket = getattr(sock, "_sock", sock)
        self.buf = bytearray()

    def _fill(self, n: int, deadline: float) -> bool:
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline")
            self.raw.settimeout(min(left, 3600.0))
            chunk = self.raw.recv(max(65536, n - len(self.buf)))
            if not chunk:
                return False
            self.buf += chunk
        return True

    def next(self, deadline: float) -> tuple[int, bytes] | None:
        if not self._fill(8, deadline):
            return None
        stream, size = self.buf[0], struct.unpack(">I", bytes(self.buf[4:8]))[0]
        if not self._fill(8 + size, deadline):
            return None
        payload = bytes(self.buf[8:8 + size])
        del self.buf[:8 + size]
        return stream, payload

    def close(self) -> None:
        for s in (self.raw, self.io):
            try:
                s.close()
            except Exception:  # noqa: BLE001
                pass


def _container_args(api: Any, spec: SandboxSpec, s: SandboxSettings, cwd: str, image_cfg: dict) -> dict[str, Any]:
    """create_container's arguments: the hardened defaults, the labels, the work space."""
    if _is_root(s.user):
        log.warning("SANDBOX RUNS AS ROOT: settings.user=%r (the safe default is 65534:65534)", s.user)
    mounts, why_not = _tmpfs_plan(cwd, s, image_cfg.get("WorkingDir") or "", sorted(image_cfg.get("Volumes") or {}))
    if why_not:
        _say_cwd_read_only(spec.image, cwd, why_not, s)
    opts = f"rw,exec,nosuid,nodev,size={s.tmpfs_size},mode=1777"
    _check_tmpfs_budget(s, len(mounts) + 1)  # + /dev/shm
    run, prompt = spec.run_label(), spec.prompt_label()
    labels = {**{str(k): str(v) for k, v in spec.labels.items()},
              LABEL_RUN: run, LABEL_PROMPT: prompt, LABEL_OWNER: lifecycle.owner_label()}
    host_config = api.create_host_config(
        network_mode=None if s.network else "none",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        mem_limit=s.memory,
        memswap_limit=s.memory,
        nano_cpus=int(s.cpus * 1e9),
        pids_limit=s.pids_limit,
        read_only=s.read_only,
        tmpfs={m: opts for m in mounts},
        shm_size=s.tmpfs_size,  # /dev/shm is writable even on a read-only root: cap it like the rest
        init=True,
        auto_remove=False,
    )
    return dict(image=spec.image, command=KEEPALIVE[1:], entrypoint=KEEPALIVE[:1], user=s.user, labels=labels,
                name=f"hermes-{_slug(run, 24)}-{_slug(prompt, 16)}-{secrets.token_hex(3)}",
                host_config=host_config, working_dir="/tmp", detach=True,
                environment={"HOME": "/tmp", "TMPDIR": "/tmp"})


_said_read_only: set[tuple[str, str]] = set()


def _say_cwd_read_only(image: str, cwd: str, why: str, s: SandboxSettings) -> None:
    with _engine_lock:
        if (image, cwd) in _said_read_only:
            return
        _said_read_only.add((image, cwd))
    if s.read_only:
        log.warning("sandbox cwd %s of image %s stays READ-ONLY: %s, so no writable tmpfs is laid over it, "
                    "and the root filesystem is read-only; commands cannot write there. Use a cwd under %s, "
                    "or set sandbox.read_only=false (the image's own files then become writable too).",
                    cwd, image, why, resolve_cwd(None, s.workdir))
    else:
        log.warning("sandbox cwd %s of image %s gets no tmpfs (%s): writes there land in the container's "
                    "own layer, on the host's disk, with no size limit", cwd, image, why)


# --------------------------------------------------------------------------- the sandbox

_live_lock = threading.Lock()
_live: set["DockerSandbox"] = set()


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


class _ChannelLost(SandboxError):
    """The channel's shell was gone before it took the request: it can be sent again on a new one."""


class _Channel:
    """The open exec of a container's command channel (see _SERVER): requests out, frames in."""

    def __init__(self, exec_id: str, frames: _Frames):
        self.exec_id = exec_id
        self.frames = frames
        self.pid: str | None = None

    def send(self, data: bytes, deadline: float) -> None:
        self.frames.raw.settimeout(max(0.01, deadline - time.monotonic()))
        self.frames.raw.sendall(data)

    def close(self) -> None:
        self.frames.close()  # its shell reads EOF and ends once its current command has


class DockerSandbox:
    """One prompt's container. Create with ``DockerSandbox(spec, settings)``; close when done.

    Commands and file operations go over one long-lived channel exec (see _SERVER), opened on
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
        if out is None:
            exec_id, frames = self._exec_socket(["sh", "-c", _WRAPPER, "hermes-exec", nonce, _fmt_seconds(limit), workdir,
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
        out, err, code = self._run_plain(["sh", "-c", _READ, "hermes-read", self.cwd, path], None, self._file_timeout())
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
        _, err, code = self._run_plain(["sh", "-c", _WRITE, "hermes-write", self.cwd, path], data,
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


_budget_warned: set[tuple[str, str, int]] = set()


def _check_tmpfs_budget(s: SandboxSettings, mounts: int) -> None:
    """tmpfs pages are charged to the container's memory: full tmpfs mounts can OOM-kill it."""
    from docker.utils import parse_bytes

    key = (s.memory, s.tmpfs_size, mounts)
    if key in _budget_warned:
        return
    _budget_warned.add(key)
    try:
        total, memory = parse_bytes(s.tmpfs_size) * mounts, parse_bytes(s.memory)
    except Exception:  # noqa: BLE001 - the engine will reject a bad size itself
        return
    if memory and total >= memory:
        log.warning("sandbox tmpfs: %d mounts x %s = %d MiB >= memory %s: filling them will get the whole "
                    "container OOM-killed; lower tmpfs_size or raise memory", mounts, s.tmpfs_size,
                    total >> 20, s.memory)


def _is_root(user: str) -> bool:
    head = user.split(":", 1)[0].strip()
    return head in ("", "0", "root")


# --------------------------------------------------------------------------- leftovers


@dataclass(frozen=True)
class Leftover:
    id: str
    name: str
    run: str
    owner: str
    alive: bool | None  # is its owner process still running? None: cannot tell (another host, no label)


def leftovers(run_id: str | None = None, *, client: docker.DockerClient | None = None) -> list[Leftover]:
    """This product's containers (every run's, or one run's), each with whether its owner lives."""
    client = client or get_client()
    label = LABEL_RUN if run_id is None else f"{LABEL_RUN}={run_id}"
    try:
        found = client.api.containers(all=True, filters={"label": label})
    except DockerException as e:
        raise SandboxError(f"cannot list containers: {e}") from e
    out = []
    for c in found:
        labels = c.get("Labels") or {}
        owner = labels.get(LABEL_OWNER, "")
        out.append(Leftover(id=c["Id"], name=(c.get("Names") or ["/?"])[0].lstrip("/"), run=labels.get(LABEL_RUN, ""),
                            owner=owner, alive=lifecycle.owner_alive(owner, c.get("Created"))))
    return out


def remove(containers: list[Leftover] | list[str], *, client: docker.DockerClient | None = None) -> int:
    """Force-remove containers (and their anonymous volumes), a few at once. Returns how many went."""
    client = client or get_client()
    ids = [c.id if isinstance(c, Leftover) else c for c in containers]
    if not ids:
        return 0
    with ThreadPoolExecutor(max_workers=min(8, len(ids)), thread_name_prefix="sandbox-remove") as pool:
        return sum(pool.map(lambda cid: _remove(client, cid), ids))


def _remove(client: docker.DockerClient, cid: str, settings: SandboxSettings | None = None) -> bool:
    """Force-remove one container. With `settings`, through the engine gate and its time limit
    (a prompt's own container); without, directly (cleanup of leftovers, signal handlers)."""
    try:
        if settings is None:
            client.api.remove_container(cid, force=True, v=True)
        else:
            with _engine_call(f"remove of {cid[:12]}", settings):
                _lifecycle_client(client, settings.engine_timeout).api.remove_container(cid, force=True, v=True)
        return True
    except NotFound:
        return False
    except (DockerException, SandboxError, requests.exceptions.RequestException) as e:
        log.warning("could not remove sandbox container %s: %s", cid[:12], e)
        return False


# --------------------------------------------------------------------------- background removal

#: threads removing closed prompts' containers, so that a prompt's slot never waits for the engine
REMOVER_THREADS = 3
#: removals queued beyond this are done by the closing thread itself: back-pressure, not a backlog
MAX_PENDING_REMOVALS = 64

_removals: "queue.Queue[tuple[docker.DockerClient, str, SandboxSettings]]" = queue.Queue()
_pending_cond = threading.Condition()
_pending: set[str] = set()
_removers: list[threading.Thread] = []


def _remove_later(client: docker.DockerClient, cid: str, settings: SandboxSettings) -> None:
    """Hand a container to the background removers; False-free: it is removed either way."""
    with _pending_cond:
        if len(_pending) >= MAX_PENDING_REMOVALS:
            queued = False
        else:
            queued = True
            _pending.add(cid)
            if len(_removers) < REMOVER_THREADS:
                t = threading.Thread(target=_remover_loop, name=f"sandbox-remover-{len(_removers)}", daemon=True)
                _removers.append(t)
                t.start()
    if queued:
        _removals.put((client, cid, settings))
    else:
        _remove(client, cid, settings)


def _remover_loop(block: bool = True) -> None:
    while True:
        try:
            client, cid, settings = _removals.get(block=block)
        except queue.Empty:
            return
        try:
            _remove(client, cid, settings)
        finally:
            with _pending_cond:
                _pending.discard(cid)
                _pending_cond.notify_all()


def pending_removals() -> int:
    """Containers closed but not yet removed."""
    with _pending_cond:
        return len(_pending)


def drain_removals(timeout: float | None = 60.0) -> bool:
    """Wait until every container closed so far is removed (at most `timeout` s; None: no bound).
    True when none is pending. Call at the end of a run: closing a sandbox only queues it."""
    # At a run's end nothing else needs the engine: clear the backlog with the whole engine gate,
    # not only the few standing removers (64 containers left by 64 workers took ~4 s with 3).
    helpers = max(0, _gate.limit - REMOVER_THREADS) if not _removals.empty() else 0
    for i in range(helpers):
        threading.Thread(target=_remover_loop, args=(False,), name=f"sandbox-drain-{i}", daemon=True).start()
    with _pending_cond:
        return _pending_cond.wait_for(lambda: not _pending, timeout)


def cleanup(run_id: str | None = None, *, include_live: bool = False,
            client: docker.DockerClient | None = None) -> int:
    """Remove the containers of runs that are no longer alive (every run's, or `run_id`'s).

    `include_live` removes the others too: those of live runs, and those whose owner this
    host cannot see (another host, or no owner label). Returns how many were removed.
    """
    gone = [c for c in leftovers(run_id, client=client) if include_live or c.alive is False]
    removed = remove(gone, client=client)
    if removed:
        log.info("removed %d leftover sandbox container(s)%s", removed, f" of run {run_id}" if run_id else "")
    return removed


def remove_own(run_id: str) -> int:
    """Remove every container this process made for `run_id`, on a client of its own, so that a
    signal handler never waits for a lock the interrupted main thread may hold."""
    client = docker.from_env(timeout=30)
    try:
        me = lifecycle.owner_label()
        return remove([c for c in leftovers(run_id, client=client) if c.owner == me], client=client)
    finally:
        client.close()


@atexit.register
def _close_all() -> None:
    """At exit, every container this process still has goes: those still open, those queued."""
    with _live_lock:
        live = list(_live)
    for sb in live:
        try:
            sb.close(wait=False)
        except Exception:  # noqa: BLE001
            pass
    if drain_removals(60.0):
        return
    with _pending_cond:  # the removers are stuck: try each once more from here
        left = list(_pending)
    for cid in left:
        try:
            _remove(get_client(), cid)
        except SandboxError:  # no engine: the next run's start-up removes them
            return
