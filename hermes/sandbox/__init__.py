"""Sandboxes: where every model-written command runs.

    open_sandbox(spec, settings) -> Sandbox      one prompt's sandbox (docker unless opted out)
    cleanup(run_id=None) -> int                  remove this product's leftover containers

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
    "open_sandbox", "cleanup",
]


def open_sandbox(spec: SandboxSpec, settings: SandboxSettings) -> Sandbox:
    """Create and start one prompt's sandbox. Raises ImageUnavailable / SandboxError."""
    if settings.backend == "local":
        from hermes.sandbox.local import LocalSandbox

        return LocalSandbox(spec, settings)
    if settings.backend == "docker":
        from hermes.sandbox.docker import DockerSandbox

        return DockerSandbox(spec, settings)
    raise SandboxError(f"unknown sandbox backend: {settings.backend!r}")


def cleanup(run_id: str | None = None) -> int:
    """Remove containers labelled hermes-batch.run (all, or only `run_id`'s). Returns how many."""
    from hermes.sandbox.docker import cleanup as _cleanup

    return _cleanup(run_id)
