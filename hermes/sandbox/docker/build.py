"""Images from a build context (a task's environment/, a row's `build`), through the Docker engine.

An image is named by what it is built from: `hermes-task/<name>:<hash of the context's files>`.
So it is built once, reused by every attempt and every later run (found on the engine, nothing is
built again), and an edited context is a new image. At most `concurrency` builds run at a time in
this process, each within its time limit; a failed build is remembered for the process (its
prompts all fail with its log's tail, none builds it again) and never stops the run.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from pathlib import Path

import docker
from docker.errors import DockerException, ImageNotFound

from hermes.sandbox.base import SandboxError
from hermes.sandbox.docker.engine import get_client

log = logging.getLogger(__name__)

#: characters of a failed build's log kept in the prompt's error (its end: where the failure is)
LOG_TAIL = 2000
REPOSITORY = "hermes-task"


class BuildFailed(SandboxError):
    """An image could not be built from its context: the prompt fails with the log's tail."""


def context_hash(folder: str | Path) -> str:
    """A folder's files (paths, executable bits, contents), as 16 hex digits: the image's tag."""
    root = Path(folder)
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0")
        if path.is_symlink():
            h.update(b"l" + os.readlink(path).encode("utf-8", "surrogateescape"))
        else:
            h.update(b"x" if os.access(path, os.X_OK) else b"-")
            h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def image_tag(folder: str | Path, name: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._")[:100] or "task"
    return f"{REPOSITORY}/{slug}:{context_hash(folder)}"


_lock = threading.Lock()
_tag_locks: dict[str, threading.Lock] = {}
_failed: dict[str, str] = {}
_gates: dict[int, threading.Semaphore] = {}
#: what this process built (a test reads it to show a second run builds nothing)
built: list[str] = []


def _gate(concurrency: int) -> threading.Semaphore:
    with _lock:
        return _gates.setdefault(concurrency, threading.BoundedSemaphore(concurrency))


def build_image(context: str | Path, name: str, *, timeout: float, concurrency: int = 2,
                client: docker.DockerClient | None = None) -> str:
    """The image built from `context` (a folder with a Dockerfile), built now unless the engine has it."""
    context = Path(context)
    if not (context / "Dockerfile").is_file():
        raise BuildFailed(f"cannot build an image for {name}: no Dockerfile in {context}")
    tag = image_tag(context, name)
    client = client or get_client()
    with _lock:
        tag_lock = _tag_locks.setdefault(tag, threading.Lock())
    with tag_lock:  # the attempts of one task wait for one build
        if tag in _failed:
            raise BuildFailed(_failed[tag])
        if _present(client, tag):
            return tag
        with _gate(concurrency):
            try:
                _build(context, tag, timeout)
            except BuildFailed as e:
                _failed[tag] = str(e)
                raise
    return tag


def _present(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.api.inspect_image(tag)
        return True
    except ImageNotFound:
        return False
    except DockerException as e:
        raise SandboxError(f"docker: cannot look up image {tag}: {e}") from e


def _build(context: Path, tag: str, timeout: float) -> None:
    log.info("building image %s from %s", tag, context)
    started = time.monotonic()
    lines: list[str] = []
    # A client of its own: its socket's read time-out is the build's limit for a silent step, and
    # closing it makes the engine cancel the build.
    own = docker.from_env(timeout=max(1, int(timeout)))
    api = own.api
    error = None
    try:
        for chunk in api.build(path=str(context), tag=tag, rm=True, forcerm=True, decode=True, pull=False,
                               labels={"hermes-batch.build": "1"}):
            if "stream" in chunk:
                lines.append(chunk["stream"])
            if "error" in chunk:
                error = chunk["error"]
                lines.append(error + "\n")
            if time.monotonic() - started > timeout:
                error = f"did not finish within its {timeout:g}s (the task's build_timeout_sec)"
                break
    except DockerException as e:
        error = f"{getattr(e, 'explanation', None) or e}"
        lines.append(error + "\n")
    except OSError as e:  # the read time-out of a step that said nothing for the whole limit
        error = f"did not finish within its {timeout:g}s (the task's build_timeout_sec): {e}"
    finally:
        own.close()
    if error is None and not _present(get_client(), tag):
        error = "the engine reported no image"
    if error is not None:
        tail = "".join(lines).strip()
        tail = tail if len(tail) <= LOG_TAIL else "[...]" + tail[-LOG_TAIL:]
        raise BuildFailed(f"image build failed for {tag} from {context}: {error.strip()}\n{tail}".rstrip())
    built.append(tag)
    log.info("built image %s in %.1fs", tag, time.monotonic() - started)


_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", re.I | re.M)


def build_problems(context: str | Path, client: docker.DockerClient | None = None) -> list[str]:
    """What would stop a build here, found without building: no Dockerfile, a base image this
    engine lacks (no registry may answer: the build would have to pull it)."""
    dockerfile = Path(context) / "Dockerfile"
    if not dockerfile.is_file():
        return [f"no Dockerfile in {context}"]
    try:
        client = client or get_client()
    except SandboxError as e:
        return [f"no Docker engine to build with: {e}"]
    problems, stages = [], set()
    for base, alias in _FROM.findall(dockerfile.read_text(encoding="utf-8", errors="replace")):
        if base.lower() != "scratch" and base not in stages and "$" not in base and not _present(client, base):
            problems.append(f"its Dockerfile's FROM {base} is not on this engine: the build would pull it")
        if alias:
            stages.add(alias)
    return problems
