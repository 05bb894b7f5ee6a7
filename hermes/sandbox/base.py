"""The sandbox protocol: one small interface, several backends (docker, local).

Every tool call a model makes runs through a Sandbox. A backend (hermes/sandbox/registry.py)
makes them and owns their whole lifecycle; backends live beside this file and register
themselves under the name `settings.backend` gives.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Annotated, Literal, Protocol, runtime_checkable

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from hermes.errors import HermesError
from hermes.environment import read

import hermes.sandbox as _package  # this module's own package (its public surface)

#: label every container made by this product carries; its value is the run id
LABEL_RUN = "hermes-batch.run"
#: label naming the prompt (row index or content key) a container serves
LABEL_PROMPT = "hermes-batch.prompt"
#: label naming the process that made the container: "<hostname>:<pid>"
LABEL_OWNER = "hermes-batch.owner"
#: run id used when a spec names none (ad-hoc use, tests, the demo)
ADHOC_RUN = "adhoc"
#: the default image: Debian with python3, git, curl and the usual tools (hermes/sandbox/image.py)
DEFAULT_IMAGE = "hermes-sandbox:bookworm"
#: the small busybox image, for tests and benchmarks that want a sandbox and nothing more
MINI_IMAGE = "hermes-sandbox-mini:latest"
#: names the image for rows that name none when settings do not (the test suite pins the mini image so)
IMAGE_ENV = "HERMES_SANDBOX_IMAGE"
#: seconds a sandbox outlives its spec's `lifetime` before it ends by itself: room for the prompt's
#: own time-out, its cancel and its close to run first (the sandbox starts after the prompt does)
LIFETIME_MARGIN = 60.0


class SandboxError(HermesError):
    """A sandbox could not be created or used."""


class EngineTimeout(SandboxError):
    """The Docker engine did not answer a container create/start/remove in time (or had too many
    such calls queued). The prompt should fail now: asking again would only wait again."""

    kind = "engine time-out"
    transient = True


class WeakerSandbox(SandboxError):
    """The engine cannot apply a limit and the run did not accept that."""


class MissingRuntime(WeakerSandbox):
    """The settings name a container runtime (e.g. runsc) the engine does not have. Never
    accepted by allow_weaker_sandbox: the isolation asked for would not be there at all."""


class ImageUnavailable(SandboxError):
    """The prompt's image is neither present locally nor pullable in time."""

    kind = "image unavailable"
    transient = False

    def __init__(self, image: str, reason: str = ""):
        self.image = image
        self.reason = reason
        super().__init__(f"image not available: {image}" + (f" ({reason})" if reason else ""))


@dataclass
class ExecResult:
    exit_code: int          # -1 when the command was killed (time limit, or an endless flood of output)
    output: str             # stdout and stderr interleaved, decoded with errors="replace", capped
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0   # seconds, host side


def _backend_names() -> tuple[str, ...]:
    # The package's registry, read when a setting is validated: by then the package has imported
    # every backend, and this module needs nothing of the registry's own module.
    return _package.backend_names()


def _registered(name: str) -> str:
    names = _backend_names()
    if name not in names:
        raise PydanticCustomError("literal_error", "Input should be {expected}",
                                  {"expected": " or ".join(repr(n) for n in names)})
    return name


#: a sandbox backend's name: the registry, not a Literal here, says which exist (a new backend
#: is one module); forms and schemas list them as an enum
BackendName = Annotated[str, AfterValidator(_registered),
                        Field(json_schema_extra=lambda schema: schema.update(enum=list(_backend_names())))]


#: a size as the Docker engine takes it: digits and an optional unit b, k, m or g ("512m", "1g")
SIZE_PATTERN = r"^[0-9]+[bkmgBKMG]?$"


class SandboxSettings(BaseModel):
    """How sandboxes are made. Every default is the safe one."""

    model_config = ConfigDict(extra="forbid")  # a misspelt key is refused, not ignored

    backend: BackendName = Field("docker", description="'local' runs model commands on this host: explicit opt-in only")
    image: str = Field(default_factory=lambda: read("sandbox_image") or DEFAULT_IMAGE,
                       description=f"image for rows that name none (default: ${IMAGE_ENV}, else {DEFAULT_IMAGE}: "
                                   "Debian with python3, git, curl; built by deployments/bootstrap.sh)")
    runtime: str | None = Field(None, description="the engine's container runtime for sandboxes, e.g. runsc "
                                "(gVisor; HERMES_INSTALL_RUNSC=1 bash deployments/bootstrap.sh registers it); "
                                "the engine's default (runc) if unset. A run naming a runtime the engine lacks is refused")
    network: bool = Field(False, description="give containers network access")
    memory: str = Field("1g", pattern=SIZE_PATTERN, description="memory limit per container, like 512m or 2g "
                        "(swap not allowed beyond it)")
    cpus: float = Field(1.0, gt=0, description="CPU limit per container")
    pids_limit: int = Field(256, gt=0, description="process limit per container")
    user: str = Field("65534:65534", description="uid:gid commands run as (non-root)")
    read_only: bool = Field(True, description="read-only root filesystem, writable tmpfs work space")
    workdir: str = Field("/workspace", description="working directory when the row names no cwd")
    tmpfs_size: str = Field("256m", pattern=SIZE_PATTERN, description="size cap of each writable tmpfs (/tmp, workdir, the row's cwd); "
                            "their contents count against `memory`: keep the sum below it")
    command_timeout: float = Field(60.0, description="seconds before a command is killed")
    output_limit: int = Field(50_000, description="characters of command output returned to the model")
    pull_timeout: float = Field(120.0, description="seconds allowed to pull a missing image")
    allow_weaker_sandbox: bool = Field(False, description="run even when the Docker engine cannot apply a limit "
                                       "(memory, swap, CPU, pids, seccomp); by default such a run is refused")
    # -- engine pacing (issue #49): how many sandbox starts are in flight at the engine
    engine_concurrency: int = Field(8, gt=0, description="the most container creates, starts and removes (runc: "
                                    "sandbox starts) in flight at the engine at once, process-wide, whatever "
                                    "--num_workers is: the ceiling of --sandbox_engine_pacing adaptive, the number "
                                    "itself with fixed")
    engine_pacing: Literal["adaptive", "fixed"] = Field(
        "adaptive", description="adaptive: find the engine's knee from its answers (raise the number in flight "
        "while sandboxes a second rise, lower it when latency climbs without them, halve it on time-outs and "
        "engine errors), under --sandbox_engine_concurrency; fixed: always that number")
    engine_timeout: float = Field(30.0, gt=0, description="seconds one container create/start/remove may take, "
                                  "including its wait for an engine slot, before the prompt fails")
    local_dir: str | None = Field(None, description="the local backend only: where its sandboxes' folders are made "
                                  "(default: the system's temporary folder; a tmpfs such as /dev/shm keeps them in memory)")
    prefetch: bool = Field(True, description="start a prompt's container while the model is thinking, "
                           "so its first tool call rarely waits for one")


@dataclass(frozen=True)
class Leftover:
    """A container (or whatever a backend makes per prompt) found still there."""

    id: str
    name: str
    run: str
    owner: str
    alive: bool | None  # is its owner process still running? None: cannot tell (another host, no label)


#: capabilities a task image keeps (TaskProfile): Docker's default set less NET_RAW (raw sockets:
#: spoofing on a network), MKNOD (device nodes), AUDIT_WRITE and SETFCAP (file capabilities), which
#: the published tasks do not need
TASK_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
                     "NET_BIND_SERVICE", "SYS_CHROOT")


@dataclass(frozen=True)
class TaskProfile:
    """A published task's image run as it was made (Harbor task folders, hermes.data.harbor).

    Its own USER (root if it names none) and WORKDIR, commands started there; a writable root
    (copy-on-write, gone with the container) instead of the read-only one with tmpfs work space;
    TASK_CAPABILITIES instead of none. Everything else stays the run's: no network unless the run
    allows it, no-new-privileges, the pids limit, the runtime; memory and CPUs are the task's,
    which the caller has already held under the run's ceiling.
    """

    memory: str | None = None
    cpus: float | None = None


@dataclass
class SandboxSpec:
    """What one prompt's sandbox needs.

    The run and prompt a container belongs to are taken from `run_id` / `prompt_id`, else
    from `labels["hermes-batch.run"]` / `labels["hermes-batch.prompt"]`. Every backend honours
    `lifetime` (a sandbox ends by itself).
    """

    image: str
    cwd: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None
    prompt_id: str | None = None
    #: seconds the sandbox may live from its start, at most (the prompt's deadline, --prompt_timeout):
    #: past it plus the backend's margin it ends and is removed by itself, even if its maker died and
    #: no later run comes. None: no limit of its own (it lives until closed or swept).
    lifetime: float | None = None
    #: run the image as published (a task folder's image) rather than under the default profile
    profile: TaskProfile | None = None

    def deadline(self) -> float | None:
        """Seconds from its start after which the sandbox ends by itself (lifetime + margin); None: never."""
        return None if self.lifetime is None else self.lifetime + LIFETIME_MARGIN

    def run_label(self) -> str:
        return str(self.run_id or self.labels.get(LABEL_RUN) or ADHOC_RUN)

    def prompt_label(self) -> str:
        return str(self.prompt_id or self.labels.get(LABEL_PROMPT) or "")


@runtime_checkable
class Sandbox(Protocol):
    def exec(self, command: str, *, cwd: str | None = None, timeout: float | None = None) -> ExecResult:
        """Run `sh -c command`; never raises for a failing or timed-out command."""

    def read_file(self, path: str) -> bytes:
        """Raise FileNotFoundError when absent, SandboxError otherwise."""

    def write_file(self, path: str, data: bytes) -> None:
        """Create parent directories as needed."""

    def warm(self) -> None:
        """Get ready for the first call (e.g. open a command channel) ahead of it; may do nothing."""

    def close(self, wait: bool = True) -> None:
        """Release everything; safe to call twice. `wait=False`: the release may finish in the
        background (the backend's end_run waits for it)."""


# --------------------------------------------------------------------------- shared helpers

TRUNCATION_MARKER = "\n[output truncated: {n} more bytes]"


class OutputCap:
    """Collects a command's raw output bytes and returns them capped at `limit` characters.

    Only about 4 bytes per allowed character are kept in memory; the rest is only counted,
    so endless output costs no memory. `flooded` turns true once `flood_bytes` more than
    that have been seen: the backend should then kill the command.
    """

    def __init__(self, limit: int, flood_bytes: int | None = None):
        self.limit = max(0, int(limit))
        self.keep = self.limit * 4 + 4
        self.flood_bytes = flood_bytes if flood_bytes is not None else max(8 << 20, self.keep * 4)
        self._buf = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.keep - len(self._buf)
        if room > 0:
            self._buf += chunk[:room]

    @property
    def flooded(self) -> bool:
        return self.total - len(self._buf) > self.flood_bytes

    def result(self) -> tuple[str, bool]:
        """(text, truncated). Invalid UTF-8 becomes U+FFFD; the marker counts uncut bytes."""
        raw = bytes(self._buf)
        text = raw.decode("utf-8", "surrogateescape")  # 1 char per invalid byte, exact round trip
        if len(text) <= self.limit and self.total == len(raw):
            return raw.decode("utf-8", "replace"), False
        kept = text[: self.limit]  # a full buffer always decodes to more than `limit` chars
        kept_bytes = kept.encode("utf-8", "surrogateescape")
        more = self.total - len(kept_bytes)
        return kept_bytes.decode("utf-8", "replace") + TRUNCATION_MARKER.format(n=more), True


def resolve_cwd(cwd: str | None, workdir: str) -> str:
    """A row's cwd as an absolute, normalised POSIX path (relative ones live under workdir)."""
    if not cwd:
        return posixpath.normpath(workdir)
    if not cwd.startswith("/"):
        cwd = posixpath.join(workdir, cwd)
    return posixpath.normpath(cwd).replace("//", "/")
