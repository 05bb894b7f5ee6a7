"""A prompt whose row builds its image or comes from a task folder: its image, limits and verifier.

A task gets the CPUs, memory and times its task.toml asks (hermes.run.task_limits: the user's
--task_max_* and the engine's capacity are the only ceilings, said once for all tasks). The image
is built through the sandbox backend (once per content hash, --build_concurrency at a time); a
build that fails fails this prompt with its log's tail (a SandboxError), never the run. A task's `docker_image` is used
where the engine has it or can pull it, else environment/ is built, with a warning naming it.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Awaitable, Callable

from hermes.data.dataset import PromptRow, Row, TaskFolder
from hermes.data.task import RowTask
from hermes.data.verifier import Verifier
from hermes.run.task_limits import summary, task_limits
from hermes.sandbox import ImageUnavailable, SandboxBackend, SandboxSpec
from hermes.sandbox.base import TaskProfile
from hermes.sandbox.registry import Capacity
from hermes.settings import RunSettings

log = logging.getLogger(__name__)

#: seconds a build may take when its task.toml names no build_timeout_sec (Harbor's default)
BUILD_TIMEOUT = 600.0
_said: set[tuple[str, str]] = set()
_said_lock = threading.Lock()


def _warn_once(task: str, what: str, message: str, *args) -> None:
    with _said_lock:
        if (task, what) in _said:
            return
        _said.add((task, what))
    log.warning(message, *args)


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
    profile, lifetime, check_timeout = await offload(limits, folder, s, backend)  # docker info, once
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


def limits(folder: TaskFolder, s: RunSettings, backend: SandboxBackend) -> tuple[TaskProfile, float | None, float]:
    """(the sandbox's profile, the prompt's time limit, the verifier's): what the task asks
    (hermes.run.task_limits), under the user's ceilings and the backend's capacity."""
    got = task_limits(folder, s, capacity_of(backend))
    return got.profile, got.lifetime, got.verifier_timeout


def limits_summary(dataset: Any, s: RunSettings, backend: SandboxBackend) -> str | None:
    """A folder of tasks' one line on what they ask and get (None for rows of a JSONL file)."""
    tasks = getattr(dataset, "tasks", None)
    if not tasks:
        return None
    return summary([t.row().task_folder for t in tasks], s, capacity_of(backend))


_capacity: dict[str, Capacity | None] = {}


def capacity_of(backend: SandboxBackend) -> Capacity | None:
    """The backend's capacity, asked once per process (an engine's does not change under a run)."""
    with _said_lock:
        if backend.name not in _capacity:
            _capacity[backend.name] = backend.capacity()
        return _capacity[backend.name]
