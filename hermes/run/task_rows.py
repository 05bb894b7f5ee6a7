"""A prompt whose row builds its image or comes from a task folder: its image, limits and verifier.

The run's flags are the ceiling: a task asking for more CPUs, memory or time than the run allows
gets the run's, and a warning says so (once per task and process). The image is built through the
sandbox backend (once per content hash, --build_concurrency at a time); a build that fails fails
this prompt with its log's tail (a SandboxError), never the run. A task's `docker_image` is used
where the engine has it or can pull it, else environment/ is built, with a warning naming it.
"""
from __future__ import annotations

import logging
import re
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Awaitable, Callable

from hermes.data.dataset import PromptRow, Row, TaskFolder
from hermes.data.task import RowTask
from hermes.data.verifier import Verifier
from hermes.sandbox import ImageUnavailable, SandboxBackend, SandboxSpec
from hermes.sandbox.base import TaskProfile
from hermes.settings import RunSettings

log = logging.getLogger(__name__)

#: seconds a build may take when its task.toml names no build_timeout_sec (Harbor's default)
BUILD_TIMEOUT = 600.0
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_said: set[tuple[str, str]] = set()
_said_lock = threading.Lock()


def _warn_once(task: str, what: str, message: str, *args) -> None:
    with _said_lock:
        if (task, what) in _said:
            return
        _said.add((task, what))
    log.warning(message, *args)


def _mb(size: str) -> int:
    m = re.fullmatch(r"(\d+)([bkmg]?)", size.strip().lower())
    return int(m.group(1)) * _UNITS[m.group(2)] >> 20 if m else 0


def needs_preparing(row: Row) -> bool:
    return row.row.build is not None or row.row.task_folder is not None


async def prepare(row: Row, spec: SandboxSpec, task: RowTask | None, s: RunSettings, backend: SandboxBackend,
                  offload: Callable[..., Awaitable[Any]]) -> tuple[SandboxSpec, RowTask | None]:
    """The prompt's spec and task, its image built or found (raises SandboxError when it cannot be had).
    offload: runs the blocking build on the run's threads (hermes.agent.offload)."""
    image = await offload(resolve_image, row.row, backend, s)
    spec = replace(spec, image=image)
    folder = row.row.task_folder
    if folder is None:
        return spec, task
    profile, lifetime, check_timeout = limits(folder, s)
    verifier = Verifier(folder.tests, check_timeout, network=s.sandbox.network or s.verifier_network,
                        own_network=s.verifier_network and not s.sandbox.network)
    return (replace(spec, profile=profile, lifetime=lifetime),
            RowTask.of(row.row, s.setup_timeout, check_timeout, verifier))


def resolve_image(row: PromptRow, backend: SandboxBackend, s: RunSettings) -> str:
    """The row's image: its own where the engine has it or can pull it, else built from `build`."""
    name = row.task_folder.name if row.task_folder else Path(row.build or "image").name
    if row.container_image and row.build:
        try:
            backend.ensure_image(row.container_image)
            return row.container_image
        except ImageUnavailable as e:
            _warn_once(name, "image", "task %s: its image %s cannot be had here (%s); building it from %s instead",
                       name, row.container_image, e.reason or e, row.build)
    if row.build is None:
        return row.container_image or s.sandbox.image
    timeout = (row.task_folder.build_timeout if row.task_folder else None) or BUILD_TIMEOUT
    return backend.build_image(row.build, name, timeout=timeout, concurrency=s.build_concurrency)


def limits(folder: TaskFolder, s: RunSettings) -> tuple[TaskProfile, float | None, float]:
    """(the sandbox's profile, the prompt's time limit, the verifier's) under the run's ceilings."""
    name = folder.name
    cpus = s.sandbox.cpus
    if folder.cpus is not None:
        if folder.cpus > cpus:
            _warn_once(name, "cpus", "task %s asks for %g CPUs; the run allows %g (--sandbox_cpus)", name, folder.cpus, cpus)
        cpus = min(folder.cpus, cpus)
    memory = s.sandbox.memory
    ceiling = _mb(memory)
    if folder.memory_mb is not None:
        if ceiling and folder.memory_mb > ceiling:
            _warn_once(name, "memory", "task %s asks for %d MB of memory; the run allows %s (--sandbox_memory)",
                       name, folder.memory_mb, memory)
        else:
            memory = f"{folder.memory_mb}m"
    if folder.storage_mb is not None:
        _warn_once(name, "storage", "task %s asks for %d MB of disk: not enforced (its writes go to the container's "
                   "own layer, gone with it)", name, folder.storage_mb)
    check = s.check_timeout
    if folder.verifier_timeout is not None:
        if folder.verifier_timeout > check:
            _warn_once(name, "verifier", "task %s gives its verifier %gs; the run allows %gs (--check_timeout)",
                       name, folder.verifier_timeout, check)
        check = min(folder.verifier_timeout, check)
    lifetime = s.prompt_timeout
    if folder.agent_timeout is not None:
        wanted = folder.agent_timeout + check + s.setup_timeout
        if lifetime is not None and wanted > lifetime:
            _warn_once(name, "agent", "task %s gives its agent %gs (plus %gs for its verifier); the run allows the "
                       "whole prompt %gs (--prompt_timeout)", name, folder.agent_timeout, check, lifetime)
        lifetime = wanted if lifetime is None else min(wanted, lifetime)
    return TaskProfile(memory=memory, cpus=cpus), lifetime, check
