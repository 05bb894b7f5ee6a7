"""What a task folder's sandbox gets: what its task.toml asks for, as Harbor gives it.

A task's own `cpus`, `memory_mb` and `[agent]` / `[verifier]` `timeout_sec` are used as given; the
run's flags (--sandbox_cpus, --sandbox_memory, --prompt_timeout, --check_timeout) only fill in what
a task.toml leaves out. Published tasks ask for more than those defaults (2-4 GB, 900 s of
verifier time), and their authors' verdicts were reached with that much: less makes a task fail
for reasons that have nothing to do with the agent.

Ceilings, each only where it is real:
  --task_max_cpus, --task_max_memory, --task_max_timeout   set by the user (unset: none)
  the backend's capacity                                   more than the engine has (its NCPU,
                                                           MemTotal) cannot be given, and Docker
                                                           refuses more CPUs than it has
What was capped is said once for all tasks (summary), not once per task. `storage_mb` is read
and reported, not enforced: a task's writes go to its container's own layer, gone with it, as
under Harbor's docker environment.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from hermes.data.dataset import TaskFolder
from hermes.sandbox.base import TaskProfile
from hermes.sandbox.registry import Capacity
from hermes.settings import RunSettings

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def size_mb(size: str) -> int:
    """'2g' -> 2048 (the sandbox settings' SIZE_PATTERN); 0 when it is not a size."""
    m = re.fullmatch(r"(\d+)([bkmg]?)", size.strip().lower())
    return int(m.group(1)) * _UNITS[m.group(2)] >> 20 if m else 0


@dataclass(frozen=True)
class TaskLimits:
    """One task's sandbox: its resources and times, and what was lowered (with why)."""

    cpus: float
    memory_mb: int
    agent_timeout: float | None  # None: the task gives none; the whole prompt has --prompt_timeout
    verifier_timeout: float
    lifetime: float | None  # the whole prompt: setup + agent + verifier
    capped: tuple[tuple[str, str], ...] = ()  # (what, why), e.g. ("memory", "--task_max_memory 2g")

    @property
    def profile(self) -> TaskProfile:
        return TaskProfile(memory=f"{self.memory_mb}m", cpus=self.cpus)


def task_limits(folder: TaskFolder, s: RunSettings, capacity: Capacity | None) -> TaskLimits:
    capped: list[tuple[str, str]] = []

    def ceiling(what: str, wanted: float, limits: Iterable[tuple[float, str] | None]) -> float:
        for limit, why in filter(None, limits):
            if wanted > limit:
                wanted = limit
                capped.append((what, why))
        return wanted

    cap_cpus = cap_memory = None
    if capacity is not None:
        cap_cpus = (capacity.cpus, f"the {capacity.where} has {capacity.cpus:g} CPUs")
        cap_memory = (capacity.memory_mb, f"the {capacity.where} has {capacity.memory_mb} MB")
    user_cpus = (s.task_max_cpus, f"--task_max_cpus {s.task_max_cpus:g}") if s.task_max_cpus else None
    user_memory = (size_mb(s.task_max_memory), f"--task_max_memory {s.task_max_memory}") if s.task_max_memory else None
    cpus = ceiling("cpus", folder.cpus if folder.cpus is not None else s.sandbox.cpus, [user_cpus, cap_cpus])
    memory = ceiling("memory", folder.memory_mb if folder.memory_mb is not None else size_mb(s.sandbox.memory),
                     [user_memory, cap_memory])
    timeout_cap = [(s.task_max_timeout, f"--task_max_timeout {s.task_max_timeout:g}") if s.task_max_timeout else None]
    verifier = ceiling("verifier time", folder.verifier_timeout or s.check_timeout, timeout_cap)
    agent = None if folder.agent_timeout is None else ceiling("agent time", folder.agent_timeout, timeout_cap)
    lifetime = s.prompt_timeout if agent is None else agent + verifier + s.setup_timeout
    return TaskLimits(cpus=cpus, memory_mb=int(memory), agent_timeout=agent, verifier_timeout=verifier,
                      lifetime=lifetime, capped=tuple(capped))


def _counted(values: Counter, show, none: str) -> str:
    """"12 ask 2 GB, 2 ask 4 GB, 1 give none (the run's 1g)": smallest first."""
    parts = [f"{n} ask {show(v)}" for v, n in sorted((kv for kv in values.items() if kv[0] is not None))]
    if values.get(None):
        parts.append(f"{values[None]} give none (the run's {none})")
    return ", ".join(parts)


def _mb_text(mb: int) -> str:
    return f"{mb / 1024:g} GB" if mb % 1024 == 0 else f"{mb} MB"


def summary(folders: list[TaskFolder], s: RunSettings, capacity: Capacity | None) -> str:
    """One line for all tasks: what they ask, what they get where it is less, and why."""
    if not folders:
        return "no tasks"
    mem = Counter(f.memory_mb for f in folders)
    cpus = Counter(f.cpus for f in folders)
    line = (f"{len(folders)} task(s): memory {_counted(mem, _mb_text, s.sandbox.memory)}; "
            f"CPUs {_counted(cpus, lambda c: f'{c:g}', f'{s.sandbox.cpus:g}')}")
    verifier = [f.verifier_timeout for f in folders if f.verifier_timeout]
    agent = [f.agent_timeout for f in folders if f.agent_timeout]
    if agent:
        line += f"; agent time up to {max(agent):g} s"
    line += f"; verifier time up to {max(verifier or [s.check_timeout]):g} s"
    storage = [f.storage_mb for f in folders if f.storage_mb]
    if storage:
        line += f"; {len(storage)} ask storage (up to {max(storage)} MB): not enforced"
    capped = Counter(c for f in folders for c in task_limits(f, s, capacity).capped)
    if capped:
        line += "; capped: " + ", ".join(f"{what} of {n} task(s) ({why})" for (what, why), n in sorted(capped.items()))
    else:
        line += "; each gets what it asks"
    return line
