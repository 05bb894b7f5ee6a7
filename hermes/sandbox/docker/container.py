"""What a sandbox container is made with, and the probe that checks the engine applies it.

Every container gets, unless the settings say otherwise: no network, every capability
dropped, no-new-privileges, a non-root user, memory (no extra swap), CPU and pids limits,
a read-only root with size-capped tmpfs work space at /tmp, at the work dir, at the row's
cwd and over the image's VOLUMEs, /dev/shm capped the same, an init process as PID 1, and
labels naming the run, the prompt and the owner process. It is kept alive by `sleep`, until the
spec's deadline (lifetime + margin) at most, and the engine removes it when that ends (AutoRemove).
`limit_problems()` says which limits the engine would not apply, before a run starts.
"""
from __future__ import annotations

import logging
import math
import re
import secrets
import threading
from typing import Any

import docker
from docker.errors import DockerException
from docker.types import Ulimit

from hermes.sandbox import lifecycle
from hermes.sandbox.base import (
    LABEL_OWNER,
    LABEL_PROMPT,
    LABEL_RUN,
    MissingRuntime,
    SandboxError,
    SandboxSettings,
    SandboxSpec,
    TASK_CAPABILITIES,
    resolve_cwd,
)
from hermes.sandbox.docker.engine import engine_problems, get_client, host_config_problems, image_config
from hermes.sandbox.docker.limits import pids_limits
from hermes.sandbox.docker.removal import remove_one

log = logging.getLogger(__name__)

#: the harmless command that keeps a sandbox container alive (busybox and coreutils alike) when
#: its spec sets no lifetime; with one it sleeps that long plus the margin (keepalive())
KEEPALIVE = ["sleep", "2147483647"]


def keepalive(spec: SandboxSpec) -> list[str]:
    """The container's main process: it ends at the spec's deadline, and the engine then removes
    the container (AutoRemove), whoever made it and whether or not anyone is left to remove it."""
    deadline = spec.deadline()
    return KEEPALIVE if deadline is None else ["sleep", str(max(1, math.ceil(deadline)))]
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


# --------------------------------------------------------------------------- create arguments


def container_args(api: Any, spec: SandboxSpec, s: SandboxSettings, cwd: str, image_cfg: dict) -> dict[str, Any]:
    """create_container's arguments: the hardened defaults, the labels, the work space."""
    task = spec.profile is not None  # a task image as published (profile.py): its own user, a writable root
    if _is_root(s.user) and not task:
        log.warning("SANDBOX RUNS AS ROOT: settings.user=%r (the safe default is 65534:65534)", s.user)
    mounts, why_not = ([], None) if task else _tmpfs_plan(cwd, s, image_cfg.get("WorkingDir") or "",
                                                           sorted(image_cfg.get("Volumes") or {}))
    if why_not:
        _say_cwd_read_only(spec.image, cwd, why_not, s)
    opts = f"rw,exec,nosuid,nodev,size={s.tmpfs_size},mode=1777"
    _check_tmpfs_budget(s, len(mounts) + 1)  # + /dev/shm
    run, prompt = spec.run_label(), spec.prompt_label()
    host_pids, nproc = pids_limits(s)
    labels = {**{str(k): str(v) for k, v in spec.labels.items()},
              LABEL_RUN: run, LABEL_PROMPT: prompt, LABEL_OWNER: lifecycle.owner_label()}
    host_config = api.create_host_config(
        network_mode=None if s.network else "none",
        cap_drop=["ALL"],
        cap_add=list(TASK_CAPABILITIES) if task else None,
        security_opt=["no-new-privileges"],
        mem_limit=s.memory,
        memswap_limit=s.memory,
        nano_cpus=int(s.cpus * 1e9),
        pids_limit=host_pids,
        ulimits=[Ulimit(name="nproc", soft=nproc, hard=nproc)] if nproc else None,
        read_only=s.read_only,
        tmpfs={m: opts for m in mounts},
        shm_size=s.tmpfs_size,  # /dev/shm is writable even on a read-only root: cap it like the rest
        init=True,
        auto_remove=True,  # its main process's end (keepalive's deadline, or the container's death) removes it
        runtime=s.runtime,  # None: the engine's default (runc)
    )
    main = keepalive(spec)
    return dict(image=spec.image, command=main[1:], entrypoint=main[:1], user=s.user, labels=labels,
                name=f"hermes-{_slug(run, 24)}-{_slug(prompt, 16)}-{secrets.token_hex(3)}",
                host_config=host_config, working_dir=s.workdir if task else "/tmp", detach=True,
                environment=None if task else {"HOME": "/tmp", "TMPDIR": "/tmp"})


_said_lock = threading.Lock()
_said_read_only: set[tuple[str, str]] = set()


def _say_cwd_read_only(image: str, cwd: str, why: str, s: SandboxSettings) -> None:
    with _said_lock:
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


def _slug(s: str, n: int) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", s).strip("-.")[:n] or "x"


# --------------------------------------------------------------------------- limit probe

_LIMIT_WORDS = re.compile(r"limit|swap|memory|cpu|pids|cgroup|seccomp|oom", re.I)


def limit_problems(settings: SandboxSettings, image: str | None = None, *, run_id: str | None = None,
                   client: docker.DockerClient | None = None) -> list[str]:
    """Limits this engine would not enforce on a run's containers ([] when all hold).

    The engine's own report, then a probe: one container made (never started) with the
    run's settings, whose create-time warnings and applied HostConfig are read back.
    """
    client = client or get_client()
    check_runtime(client, settings)
    problems = [p for p in engine_problems(client) if _LIMIT_WORDS.search(p)]
    for p in _probe(client, settings, image or settings.image, run_id or lifecycle.PROBE_RUN):
        if p not in problems:
            problems.append(p)
    return problems


def check_runtime(client: docker.DockerClient, settings: SandboxSettings) -> None:
    """Refuse settings naming a container runtime the engine does not have: no weaker sandbox
    can stand in for the isolation asked for."""
    if not settings.runtime:
        return
    try:
        runtimes = client.info().get("Runtimes") or {}
    except DockerException as e:
        raise SandboxError(f"docker info failed: {e}") from e
    if settings.runtime not in runtimes:
        hint = (" Install and register gVisor: HERMES_INSTALL_RUNSC=1 bash deployments/bootstrap.sh"
                if settings.runtime == "runsc" else "")
        raise MissingRuntime(f"the Docker engine has no container runtime {settings.runtime!r} (it has: "
                           f"{', '.join(sorted(runtimes)) or 'none listed'}), so --sandbox_runtime "
                           f"{settings.runtime} cannot be applied.{hint}")


def _probe(client: docker.DockerClient, settings: SandboxSettings, image: str, run_id: str) -> list[str]:
    try:
        image_cfg = image_config(image, settings.pull_timeout, client)
    except SandboxError as e:
        log.warning("sandbox limits not probed: %s", e)
        return []
    spec = SandboxSpec(image=image, run_id=run_id, prompt_id="probe")
    args = container_args(client.api, spec, settings, resolve_cwd(None, settings.workdir), image_cfg)
    try:
        res = client.api.create_container(**args)
    except DockerException as e:
        raise SandboxError(f"cannot make a probe container from {image}: {getattr(e, 'explanation', None) or e}") from e
    try:
        hc = client.api.inspect_container(res["Id"]).get("HostConfig") or {}
        created = [f"engine said on container create: {w}" for w in res.get("Warnings") or []]
        return created + host_config_problems(hc, settings)
    finally:
        remove_one(client, res["Id"])
