"""Sandboxes: where every model-written command runs.

A backend owns the whole lifecycle of its sandboxes (hermes/sandbox/registry.py says what that
is); callers find it by the settings' name and never branch on it:

    backend = get_backend(settings)     -> SandboxBackend (settings.backend: "docker" unless opted out)
    backend.open(spec) -> Sandbox       one prompt's sandbox

and, for callers that want one call:

    open_sandbox(spec, settings) -> Sandbox      get_backend(settings).open(spec)
    cleanup(run_id=None) -> int                  remove sandboxes of runs no longer alive
    check_limits(settings, run_id) -> list[str]  refuse a run whose limits the engine cannot apply
    drain_removals(timeout) -> bool              wait for sandboxes closed but still being removed

The docker backend is the default and the only one that isolates anything; the local
backend runs commands on this host, only for settings that name it.
"""
from __future__ import annotations

from hermes.sandbox.base import (
    ExecResult,
    ImageUnavailable,
    Leftover,
    MissingRuntime,
    Sandbox,
    SandboxError,
    SandboxSettings,
    SandboxSpec,
    WeakerSandbox,
)
from hermes.sandbox.registry import SandboxBackend, SandboxRun, backend_names, get_backend, register

# The backends register themselves: a new one is a module and one line here.
from hermes.sandbox import docker, local, runc  # noqa: E402,F401  isort: skip

__all__ = [
    "ExecResult", "ImageUnavailable", "Leftover", "MissingRuntime", "Sandbox", "SandboxBackend", "SandboxError", "SandboxRun",
    "SandboxSettings", "SandboxSpec", "WeakerSandbox", "backend_names", "check_limits", "cleanup",
    "drain_removals", "get_backend", "open_sandbox", "register",
]


def open_sandbox(spec: SandboxSpec, settings: SandboxSettings) -> Sandbox:
    """Create and start one prompt's sandbox. Raises ImageUnavailable / SandboxError."""
    return get_backend(settings).open(spec)


def cleanup(run_id: str | None = None, *, include_live: bool = False, settings: SandboxSettings | None = None) -> int:
    """Remove sandboxes of runs no longer alive (all runs, or `run_id`'s); `include_live`:
    every one of ours. Returns how many were removed."""
    return get_backend(settings).cleanup(run_id, include_live=include_live)


def drain_removals(timeout: float | None = 60.0) -> bool:
    """Wait (at most `timeout` s, per backend) until every sandbox closed in the background is
    removed. True when none is left pending. A run's end_run does it; exit removes them anyway."""
    return all([get_backend(SandboxSettings(backend=name)).drain(timeout) for name in backend_names()])


def check_limits(settings: SandboxSettings, run_id: str | None = None) -> list[str]:
    """The limits the backend would not apply to this run's sandboxes.

    Raises WeakerSandbox naming them unless settings.allow_weaker_sandbox; else returns them.
    [] when every limit holds.
    """
    return get_backend(settings).check_limits(run_id)
