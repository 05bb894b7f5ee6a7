"""Sandboxes: where every model-written command runs.

    open_sandbox(spec, settings) -> Sandbox      one prompt's sandbox (docker unless opted out)
    cleanup(run_id=None) -> int                  remove containers of runs no longer alive
    check_limits(settings, run_id) -> list[str]  refuse a run whose limits the engine cannot apply
    drain_removals(timeout) -> bool              wait for containers closed but still being removed

The docker backend is the default and the only one that isolates anything; the local
backend runs commands on this host and is used only when settings.backend == "local".
"""
from __future__ import annotations

from hermes.sandbox.base import (
    ExecResult,
    ImageUnavailable,
    Sandbox,
    SandboxError,
    SandboxSettings,
    SandboxSpec,
)

__all__ = [
    "ExecResult", "ImageUnavailable", "Sandbox", "SandboxError", "SandboxSettings", "SandboxSpec",
    "open_sandbox", "cleanup", "check_limits", "drain_removals", "WeakerSandbox",
]


class WeakerSandbox(SandboxError):
    """The engine cannot apply a limit and the run did not accept that."""


def open_sandbox(spec: SandboxSpec, settings: SandboxSettings) -> Sandbox:
    """Create and start one prompt's sandbox. Raises ImageUnavailable / SandboxError."""
    if settings.backend == "local":
        from hermes.sandbox.local import LocalSandbox

        return LocalSandbox(spec, settings)
    if settings.backend == "docker":
        from hermes.sandbox.docker import DockerSandbox

        return DockerSandbox(spec, settings)
    raise SandboxError(f"unknown sandbox backend: {settings.backend!r}")


def cleanup(run_id: str | None = None, *, include_live: bool = False) -> int:
    """Remove containers of runs no longer alive (all runs, or `run_id`'s); `include_live`:
    every container of ours. Returns how many were removed."""
    from hermes.sandbox.docker import cleanup as _cleanup

    return _cleanup(run_id, include_live=include_live)


def drain_removals(timeout: float | None = 60.0) -> bool:
    """Wait (at most `timeout` s) until every container closed in the background is removed.
    True when none is left pending. A run calls it as it ends; exit removes them anyway."""
    import sys

    backend = sys.modules.get("hermes.sandbox.docker")
    if backend is None:  # no docker sandbox was ever made here: nothing can be pending
        return True
    return backend.drain_removals(timeout)


def check_limits(settings: SandboxSettings, run_id: str | None = None) -> list[str]:
    """The limits the Docker engine would not apply to this run's containers.

    Raises WeakerSandbox naming them unless settings.allow_weaker_sandbox; else returns them
    (logged loudly). [] when every limit holds.
    """
    from hermes.sandbox.docker import limit_problems

    problems = limit_problems(settings, run_id=run_id)
    if problems and not settings.allow_weaker_sandbox:
        raise WeakerSandbox(weaker_sandbox_message(problems))
    return problems


def weaker_sandbox_message(problems: list[str]) -> str:
    listed = "".join(f"\n  - {p}" for p in problems)
    return ("the Docker engine would not apply these sandbox limits, so model-written commands would run "
            f"without them:{listed}\nFix the engine (e.g. enable the missing cgroup controller) or the settings, "
            "or accept weaker sandboxes with --sandbox_allow_weaker_sandbox (settings.sandbox.allow_weaker_sandbox = true).")
