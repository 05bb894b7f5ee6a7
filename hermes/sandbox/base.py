"""The sandbox protocol: one small interface, several backends (docker, local).

Every tool call a model makes runs through a Sandbox. Backends live beside this file.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field


class SandboxError(Exception):
    """A sandbox could not be created or used."""


class ImageUnavailable(SandboxError):
    """The prompt's image is neither present locally nor pullable in time."""

    def __init__(self, image: str, reason: str = ""):
        self.image = image
        super().__init__(f"image not available: {image}" + (f" ({reason})" if reason else ""))


@dataclass
class ExecResult:
    exit_code: int          # -1 when the command was killed for its time limit
    output: str             # stdout and stderr interleaved, decoded with errors="replace", capped
    timed_out: bool = False
    truncated: bool = False


class SandboxSettings(BaseModel):
    """How sandboxes are made. Every default is the safe one."""

    backend: Literal["docker", "local"] = Field("docker", description="'local' runs model commands on this host: explicit opt-in only")
    image: str = Field("hermes-sandbox:latest", description="image for rows that name none")
    network: bool = Field(False, description="give containers network access")
    memory: str = Field("1g", description="memory limit per container")
    cpus: float = Field(1.0, description="CPU limit per container")
    pids_limit: int = Field(256, description="process limit per container")
    user: str = Field("65534:65534", description="uid:gid commands run as (non-root)")
    read_only: bool = Field(True, description="read-only root filesystem, writable tmpfs work space")
    workdir: str = Field("/workspace", description="working directory when the row names no cwd")
    command_timeout: float = Field(60.0, description="seconds before a command is killed")
    output_limit: int = Field(50_000, description="characters of command output returned to the model")
    pull_timeout: float = Field(120.0, description="seconds allowed to pull a missing image")


@dataclass
class SandboxSpec:
    """What one prompt's sandbox needs."""

    image: str
    cwd: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Sandbox(Protocol):
    def exec(self, command: str, *, cwd: str | None = None, timeout: float | None = None) -> ExecResult:
        """Run `sh -c command`; never raises for a failing or timed-out command."""

    def read_file(self, path: str) -> bytes:
        """Raise FileNotFoundError when absent, SandboxError otherwise."""

    def write_file(self, path: str, data: bytes) -> None:
        """Create parent directories as needed."""

    def close(self) -> None:
        """Release everything; safe to call twice."""
