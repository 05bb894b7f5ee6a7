"""The Docker engine: the process-wide client, the gate its container calls pass, what it
says it cannot enforce, and the images it has.

Creates, starts and removes pass a process-wide gate paced to the engine (hermes/sandbox/pacing.py;
settings.engine_concurrency its ceiling) with a time limit (settings.engine_timeout).
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Iterator

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound

from hermes.sandbox.base import EngineTimeout, ImageUnavailable, SandboxError, SandboxSettings
from hermes.sandbox.docker.limits import pids_limits
from hermes.sandbox.pacing import pacer

log = logging.getLogger(__name__)

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


#: The process-wide gate of this process's container creates, starts, removes and channel execs:
#: its width found by the pacing controller (hermes/sandbox/pacing.py) under the settings' ceiling,
#: since dockerd gets slower, not faster, past a handful in flight (a bare sandbox lives ~0.5 s at 4
#: in flight, ~8 s at 64, for the same throughput; it deadlocked here at 64). Waiting for a slot is
#: bounded too, so a stuck engine fails prompts instead of piling them up.
gate = pacer("Docker engine", SandboxSettings().engine_concurrency, unit="container operations")


@contextlib.contextmanager
def engine_call(what: str, settings: SandboxSettings) -> Iterator[None]:
    """One gated engine call; a time-out becomes EngineTimeout (the SDK raises requests' own
    exceptions for it, which are no DockerException)."""
    gate.configure(settings.engine_concurrency, settings.engine_pacing == "adaptive")
    with gate.slot(what, settings.engine_timeout):
        try:
            yield
        except requests.exceptions.Timeout as e:
            raise EngineTimeout(f"Docker engine did not answer {what} within {settings.engine_timeout:g}s") from e
        except requests.exceptions.ConnectionError as e:
            raise SandboxError(f"Docker engine connection failed during {what}: {e}") from e


_lifecycle_clients: dict[float, docker.DockerClient] = {}


def lifecycle_client(client: docker.DockerClient, timeout: float) -> docker.DockerClient:
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


def engine_capacity(client: docker.DockerClient | None = None):
    """The engine's CPUs and memory (`docker info`'s NCPU and MemTotal): a container can have no
    more (Docker refuses more CPUs than NCPU). None when the engine does not say."""
    from hermes.sandbox.registry import Capacity

    try:
        info = (client or get_client()).info()
    except (DockerException, SandboxError) as e:
        log.warning("docker info failed, so a task's CPUs and memory are not checked against the engine's: %s", e)
        return None
    if not info.get("NCPU") or not info.get("MemTotal"):
        return None
    return Capacity(cpus=float(info["NCPU"]), memory_mb=int(info["MemTotal"]) >> 20, where="engine")


def report_create_warnings(warnings: list[str] | None) -> None:
    for w in warnings or []:
        with _engine_lock:
            if w in _seen_warnings:
                continue
            _seen_warnings.add(w)
        _loud("engine said on container create: %s", w)


#: the capabilities a container engine grants by default (Docker's set; Podman's is the same)
DEFAULT_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                  "NET_BIND_SERVICE", "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID",
                                  "SYS_CHROOT"})


def all_dropped(cap_drop: list[str] | None, cap_add: list[str] | None) -> bool:
    """Whether a container's CapDrop drops what it was not explicitly given: Docker keeps "ALL" as
    asked; Podman's Docker API expands it to the list of its default capabilities."""
    dropped = {c.upper().removeprefix("CAP_") for c in cap_drop or []}
    added = {c.upper().removeprefix("CAP_") for c in cap_add or []}
    return "ALL" in dropped or DEFAULT_CAPABILITIES - added <= dropped


def host_config_problems(hc: dict, settings: SandboxSettings) -> list[str]:
    """What the engine did not apply, read back from a container's HostConfig."""
    expect = {
        "Memory": ("memory limit", lambda v: bool(v)),
        "MemorySwap": ("swap limit (memory+swap)", lambda v: v == hc.get("Memory")),
        "NanoCpus": ("CPU limit", lambda v: v == int(settings.cpus * 1e9)),
        "PidsLimit": ("pids limit", lambda v: v == pids_limits(settings)[0]),
        "ReadonlyRootfs": ("read-only root", lambda v: bool(v) == settings.read_only),
        "CapDrop": ("dropped capabilities", lambda v: all_dropped(v, hc.get("CapAdd"))),
        "SecurityOpt": ("no-new-privileges", lambda v: "no-new-privileges" in (v or [])),
        "NetworkMode": ("no network", lambda v: settings.network or v == "none"),
        "Init": ("init process", lambda v: bool(v)),
        "Runtime": ("container runtime", lambda v: not settings.runtime or v == settings.runtime),
    }
    return [f"{what}: the container's HostConfig.{field} is {hc.get(field)!r}"
            for field, (what, ok) in expect.items() if not ok(hc.get(field))]


def verify_host_config(client: docker.DockerClient, cid: str, settings: SandboxSettings) -> None:
    """Once per process and settings: read back what the engine actually applied."""
    key = (_key(client), settings.model_dump_json())
    with _engine_lock:
        if key in _verified:
            return
        _verified.add(key)
    for problem in host_config_problems(client.api.inspect_container(cid).get("HostConfig") or {}, settings):
        _loud("container %s: %s", cid[:12], problem)


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
    image_config(image, 120.0 if pull_timeout is None else float(pull_timeout), client or get_client())
    return image


def image_known(image: str) -> bool:
    """Whether ensure_image(image) would return at once: this process found the image on the
    engine before. Never blocks (no client is made here)."""
    client = _client
    return client is not None and (_key(client), image) in _images_ok


def image_config(image: str, pull_timeout: float, client: docker.DockerClient) -> dict:
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
