"""Sandbox backends: one object per backend, found by its settings name, owning the whole
lifecycle of the sandboxes it makes. Inspect AI's sandbox environments are the model: one
interface with lifecycle hooks, and a registry of the backends.

    backend = get_backend(settings)         settings.backend names it ("docker", "local", ...)
    run = backend.open_run(run_id)          a run starts: what dead processes left on this host goes
                                            (any run's: backend.sweep_dead()), limits
                                            the engine cannot apply refuse it (WeakerSandbox), signals
                                            remove its sandboxes first
    backend.ensure_image(image)             the image is here (pulled within pull_timeout), else ImageUnavailable
    backend.build_image(context, name, ...)  an image built from a folder with a Dockerfile, once per content
    box = backend.open(spec)                one prompt's sandbox: image ensured, created, started
    box.close(wait=False)                   its removal left to the backend's background removers
    run.close()                             the run ends: those removals drained, sandboxes of the run
                                            this process made and no prompt held swept, signals restored
    backend.cleanup(run_id, include_live=, label=)   after a crash: remove what dead owners left
    backend.leftovers(run_id, label=) / backend.remove(found)
    backend.check_limits(run_id)            the limits it cannot apply (WeakerSandbox unless accepted)
    backend.drain(timeout)                  wait for this process's background removals
    backend.available()                     can it make sandboxes now (health checks)
    backend.ensure_default_image()          the default image exists, built here if it can be
    backend.capacity()                      the CPUs and memory one sandbox could have at most here

A new backend is one module: subclass SandboxBackend, decorate it with @register, and import
the module from hermes/sandbox/__init__.py (one line). No caller names a backend.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, ClassVar

from hermes.sandbox import lifecycle
from hermes.sandbox.base import Leftover, Sandbox, SandboxError, SandboxSettings, SandboxSpec

log = logging.getLogger(__name__)

_BACKENDS: dict[str, type["SandboxBackend"]] = {}


@dataclass(frozen=True)
class Capacity:
    """What the machine that runs the sandboxes has: no sandbox can be given more (a task asking
    more is capped to it, hermes.run.task_limits)."""

    cpus: float
    memory_mb: int
    where: str = "machine"  # named in the line that says a task was capped ("the engine has 2 CPUs")


def host_capacity() -> Capacity | None:
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
    except (ValueError, OSError):
        return None
    return Capacity(cpus=float(len(os.sched_getaffinity(0))), memory_mb=memory, where="host")


def register(cls: type["SandboxBackend"]) -> type["SandboxBackend"]:
    """Class decorator: make a backend findable by its `name`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _BACKENDS[cls.name] = cls
    return cls


def backend_names() -> tuple[str, ...]:
    """The registered backends' names, the default (docker) first."""
    return tuple(_BACKENDS)


def get_backend(settings: SandboxSettings | None = None) -> "SandboxBackend":
    """The backend `settings.backend` names, bound to those settings (default settings: docker)."""
    settings = settings if settings is not None else SandboxSettings()
    cls = _BACKENDS.get(settings.backend)
    if cls is None:
        raise SandboxError(f"unknown sandbox backend: {settings.backend!r}")
    return cls(settings)


class SandboxRun:
    """A run's hold on its backend, from open_run to close: close() is where the run's sandboxes
    end (the removals still under way are waited for, strays swept, signal handlers restored)."""

    def __init__(self, backend: "SandboxBackend", run_id: str, accepted: list[str],
                 release: Callable[[], None] | None):
        self.backend = backend
        self.run_id = run_id
        #: limits the engine cannot apply that the run accepted (allow_weaker_sandbox)
        self.accepted = accepted
        self._release = release
        self._closed = False

    def close(self, timeout: float = 120.0) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.backend.end_run(self.run_id, timeout)
        finally:
            if self._release is not None:
                self._release()

    def __enter__(self) -> "SandboxRun":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SandboxBackend:
    """One way of making sandboxes. Every hook but open() has a do-nothing default, right for a
    backend that leaves nothing behind a process (the local one)."""

    #: the settings name (`sandbox.backend`) this backend is found by
    name: ClassVar[str] = ""
    #: opening takes long enough (a container starting) to be worth starting while the model
    #: thinks (the run's `sandbox.prefetch`); where it does not, prefetch would cost a thread
    #: per prompt to save nothing
    slow_to_open: ClassVar[bool] = True

    def __init__(self, settings: SandboxSettings):
        self.settings = settings

    # -- one prompt -------------------------------------------------------------

    def ensure_image(self, image: str) -> None:
        """Make sure `image` can be used now (present, else pulled within settings.pull_timeout).
        Raises ImageUnavailable."""

    def image_known(self, image: str) -> bool:
        """Would ensure_image(image) return at once, asking no one? Asked on the prompts' event
        loop, so it must not block: True lets a prompt skip a trip to a thread for nothing."""
        return False

    def build_image(self, context: str, name: str, *, timeout: float, concurrency: int = 2) -> str:
        """The image built from `context` (a folder with a Dockerfile), once per content hash; its
        tag. Raises SandboxError (the build's log tail) when it cannot be built."""
        raise SandboxError(f"the {self.name} sandbox backend cannot build images (a row's `build`, a task's "
                           "environment/): use --sandbox_backend docker")

    def build_problems(self, context: str) -> list[str]:
        """Why an image could not be built from `context` here, found without building it ([]: none known)."""
        return []

    def capacity(self) -> Capacity | None:
        """The most CPUs and memory one sandbox can have here (None: not known). This host's by
        default: right for a backend whose sandboxes run on it."""
        return host_capacity()

    def open(self, spec: SandboxSpec) -> Sandbox:
        """Create and start one prompt's sandbox (its image ensured first). Raises
        ImageUnavailable / SandboxError / lifecycle.RunInterrupted (its run is stopping)."""
        raise NotImplementedError

    # -- one run ------------------------------------------------------------------

    def open_run(self, run_id: str) -> SandboxRun:
        """A run starts: prepare_run's checks, then guard_run's signal handling. Raises
        WeakerSandbox when a limit cannot be applied and the settings do not accept that."""
        accepted = self.prepare_run(run_id)
        return SandboxRun(self, run_id, accepted, self.guard_run(run_id))

    def prepare_run(self, run_id: str) -> list[str]:
        """Remove what dead processes left behind on this host, whatever their run (a killed run
        of another name, a scheduled run's stamped name, a dead worker: none of them may come
        back for its own); check the limits the engine cannot apply (raise WeakerSandbox unless
        allow_weaker_sandbox); return those accepted."""
        self.sweep_dead()
        accepted = self.check_limits(run_id)
        for p in accepted:
            log.warning("SANDBOX WEAKER THAN ASKED (accepted by allow_weaker_sandbox): %s", p)
        return accepted

    def check_limits(self, run_id: str | None = None) -> list[str]:
        """The limits this backend would not apply to the run's sandboxes. Raises WeakerSandbox
        naming them unless settings.allow_weaker_sandbox; else returns them. [] when all hold."""
        return []

    #: does remove_own find this backend's sandboxes (then SIGINT/SIGTERM and the run's end use it)?
    removes_own = False

    def remove_own(self, run_id: str) -> int:
        """Remove the sandboxes of `run_id` that this process made and that are still there, held by
        a prompt or not; how many went."""
        return 0

    def guard_run(self, run_id: str) -> Callable[[], None] | None:
        """Make SIGINT/SIGTERM remove the run's sandboxes first; returns what undoes that."""
        if not self.removes_own:
            return None
        return lifecycle.RunGuard(run_id, self.remove_own).install().uninstall

    def end_run(self, run_id: str, timeout: float) -> None:
        """The run ends: wait (at most `timeout` s) for background removals, then sweep strays
        (a create the engine answered too late may still have made a sandbox no prompt knew of)."""
        if not self.drain(timeout):
            log.warning("some containers of run '%s' are still being removed", run_id)
        swept = self.remove_own(run_id) if self.removes_own else 0
        if swept:
            log.warning("removed %d %s sandbox(es) of run '%s' that no prompt closed", swept, self.name, run_id)

    def drain(self, timeout: float | None = 60.0) -> bool:
        """Wait until every sandbox this process closed in the background is gone; True when
        none is left pending."""
        return True

    # -- after a crash, and the API server's reaper ---------------------------------

    def leftovers(self, run_id: str | None = None, *, label: str | None = None) -> list[Leftover]:
        """This product's sandboxes still there (every run's, or `run_id`'s; only those carrying
        `label` if given), each with whether its owner process lives."""
        return []

    def remove(self, found: list[Leftover]) -> int:
        """Remove these sandboxes; how many went."""
        return 0

    def sweep_dead(self) -> int:
        """Remove the sandboxes on this host whose owner process is dead, of any run (never one
        whose owner lives, nor one of another host's); how many went. A run's start, a worker's
        start and its batches call it."""
        dead = [c for c in self.leftovers() if c.alive is False]
        removed = self.remove(dead)
        if removed:
            runs = ", ".join(sorted({f"'{c.run}'" for c in dead}))
            log.warning("removed %d sandbox(es) left behind by an earlier, dead run (%s)", removed, runs)
        return removed

    def cleanup(self, run_id: str | None = None, *, include_live: bool = False, label: str | None = None) -> int:
        """Remove the sandboxes whose owner is dead (all with `include_live`); how many went."""
        gone = [c for c in self.leftovers(run_id, label=label) if include_live or c.alive is False]
        removed = self.remove(gone)
        if removed:
            log.info("removed %d leftover sandbox container(s)%s", removed, f" of run {run_id}" if run_id else "")
        return removed

    # -- the backend itself ---------------------------------------------------------

    def available(self) -> bool:
        """Can sandboxes be made now (an engine answers)?"""
        return True

    def ensure_default_image(self) -> str | None:
        """Make sure settings.image exists when it is the product's own image (built here if
        missing); its name, or None when the backend has no images."""
        return None
