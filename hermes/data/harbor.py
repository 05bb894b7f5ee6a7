"""Harbor task folders (Terminal-Bench 2's layout) as a source of rows, like a JSONL file.

    task-name/
      instruction.md     the prompt
      task.toml          [agent] timeout_sec, [verifier] timeout_sec, [environment] build_timeout_sec,
                         cpus, memory_mb, storage_mb, docker_image; [metadata] is carried along
      environment/       the image's build context (Dockerfile and its files)
      solution/solve.sh  the reference solution (hermes-batch verify)
      tests/test.sh      the verifier, run after the agent with tests/ at /tests

`--dataset_file` names a folder of task folders, or one task folder. Each task is a row: the
prompt is instruction.md, the image is built from environment/ (build), the rest is the row's
`task_folder` (hermes.data.dataset.TaskFolder), which the run turns into limits and a check
(hermes.data.verifier). A task's key is its content (instruction, environment, tests): an edited
task runs again, a renamed one does not. A bad task is reported with its folder and field; the
others still run when the run skips bad rows (--skip_bad_lines), as for JSONL lines.
"""
from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hermes.data.dataset import _HASH, DatasetError, PromptRow, Row, TaskFolder, attempt_key, split_attempt

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

INSTRUCTION, CONFIG, ENVIRONMENT, TESTS, SOLUTION = "instruction.md", "task.toml", "environment", "tests", "solution"


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")  # Harbor's other keys are Harbor's business


class _Agent(_Section):
    timeout_sec: float | None = Field(None, gt=0)


class _Verifier(_Section):
    timeout_sec: float | None = Field(None, gt=0)


class _Environment(_Section):
    build_timeout_sec: float | None = Field(None, gt=0)
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    storage_mb: int | None = Field(None, gt=0)
    docker_image: str | None = Field(None, min_length=1)
    # older task.toml files give sizes as text ("2G"): read into memory_mb / storage_mb
    memory: str | None = None
    storage: str | None = None


class TaskConfig(BaseModel):
    """task.toml, checked: the fields this system uses are typed, the rest kept."""

    model_config = ConfigDict(extra="allow")

    metadata: dict[str, Any] = {}
    agent: _Agent = _Agent()
    verifier: _Verifier = _Verifier()
    environment: _Environment = _Environment()


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.I)


def _mb(text: str | None, where: str) -> int | None:
    if text is None:
        return None
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"field '{where}': not a size like 2G or 512M: {text!r}")
    scale = {"": 1 / (1 << 20), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1 << 20}[m.group(2).lower()]
    return max(1, int(float(m.group(1)) * scale))


@dataclass(frozen=True)
class HarborTask:
    """One task folder, read and checked."""

    name: str
    folder: Path
    instruction: str
    config: TaskConfig
    digest: bytes  # its content key's hash (instruction, environment, tests)

    @property
    def environment(self) -> Path:
        return self.folder / ENVIRONMENT

    def row(self) -> PromptRow:
        env = self.config.environment
        has_build = (self.environment / "Dockerfile").is_file()
        solution = self.folder / SOLUTION
        folder = TaskFolder(
            name=self.name, folder=str(self.folder), tests=str(self.folder / TESTS),
            solution=str(solution) if (solution / "solve.sh").is_file() else None,
            agent_timeout=self.config.agent.timeout_sec, verifier_timeout=self.config.verifier.timeout_sec,
            build_timeout=env.build_timeout_sec, cpus=env.cpus,
            memory_mb=env.memory_mb or _mb(env.memory, "environment.memory"),
            storage_mb=env.storage_mb or _mb(env.storage, "environment.storage"))
        return PromptRow(prompt=self.instruction, image=env.docker_image,
                         build=str(self.environment) if has_build else None, task_folder=folder,
                         **({"task_metadata": self.config.metadata} if self.config.metadata else {}))


def task_folders(path: str | Path) -> list[Path]:
    """The task folders under `path`: itself when it is one, else its sub-folders (sorted)."""
    path = Path(path)
    if (path / INSTRUCTION).exists() or (path / CONFIG).exists():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def read_task(folder: Path) -> HarborTask:
    """One task folder; ValueError naming the folder and the field when it cannot be used."""
    def bad(what: str) -> ValueError:
        return ValueError(f"{folder}: {what}")

    instruction = folder / INSTRUCTION
    if not instruction.is_file():
        raise bad(f"no {INSTRUCTION}")
    try:
        prompt = instruction.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise bad(f"{INSTRUCTION} is not UTF-8 (byte {e.start})") from None
    if not prompt.strip():
        raise bad(f"{INSTRUCTION} is empty")
    config_path = folder / CONFIG
    try:
        raw = tomllib.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        config = TaskConfig.model_validate(raw)
    except tomllib.TOMLDecodeError as e:
        raise bad(f"{CONFIG} is not valid TOML ({e})") from None
    except ValidationError as e:
        fields = "; ".join(f"field '{'.'.join(str(x) for x in err['loc'])}': {err['msg']}" for err in e.errors())
        raise bad(f"{CONFIG}: {fields}") from None
    if not (folder / TESTS / "test.sh").is_file():
        raise bad(f"no {TESTS}/test.sh (the verifier)")
    if not (folder / ENVIRONMENT / "Dockerfile").is_file() and not config.environment.docker_image:
        raise bad(f"no {ENVIRONMENT}/Dockerfile and no [environment] docker_image in {CONFIG}")
    task = HarborTask(name=folder.name, folder=folder.resolve(), instruction=prompt, config=config,
                      digest=_content_digest(prompt, folder))
    try:
        task.row()
    except (ValueError, ValidationError) as e:
        raise bad(f"{CONFIG}: {e}") from None
    return task


def _content_digest(prompt: str, folder: Path) -> bytes:
    """The task's content (not its name or place): instruction, environment/ and tests/."""
    h = hashlib.sha256(b"harbor-task\0" + prompt.encode("utf-8") + b"\0")
    for part in (ENVIRONMENT, TESTS):
        root = folder / part
        for path in sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else ():
            h.update(f"{part}/{path.relative_to(root).as_posix()}\0".encode("utf-8", "surrogateescape"))
            h.update(b"x" if os.access(path, os.X_OK) else b"-")
            h.update(path.read_bytes() + b"\0")
    return h.digest()[:_HASH]


@dataclass
class TaskDataset:
    """A folder of tasks read as a dataset: the interface of hermes.data.dataset.Dataset."""

    path: Path
    tasks: list[HarborTask] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    attempts: int = 1

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def prompts(self) -> int:
        return len(self) * self.attempts

    def hash_chunks(self, size: int = 100_000) -> Iterator[tuple[int, str]]:
        for start in range(0, len(self), size):
            yield start, ",".join(t.digest.hex() for t in self.tasks[start:start + size])

    def keys(self) -> list[str]:
        seen: dict[bytes, int] = {}
        keys = []
        for t in self.tasks:
            n = seen.get(t.digest, 0)
            seen[t.digest] = n + 1
            keys += [attempt_key(f"{t.digest.hex()}-{n}", a) for a in range(1, self.attempts + 1)]
        return keys

    def indexed_keys(self) -> list[tuple[int, str]]:
        return [(i // self.attempts, k) for i, k in enumerate(self.keys())]

    def rows(self, wanted: Iterable[tuple[int, str]]) -> list[Row]:
        out = []
        for index, key in wanted:
            task = self.tasks[index]
            if _content_digest(task.instruction, task.folder) != task.digest:
                raise DatasetError(str(self.path), [f"{task.folder}: changed since the tasks were checked; "
                                                    "run again to check them anew"])
            out.append(Row(index=index, line=index + 1, key=key, row=task.row(), trial=split_attempt(key)[1]))
        return out


def read_tasks(path: str | Path, *, max_samples: int | None = None, skip_bad: bool = False,
               attempts: int = 1) -> TaskDataset:
    """Every task under `path`, checked before anything runs (DatasetError listing the bad ones)."""
    path = Path(path)
    ds = TaskDataset(path, attempts=attempts)
    for folder in task_folders(path):
        if max_samples is not None and len(ds) >= max_samples:
            break
        try:
            ds.tasks.append(read_task(folder))
        except ValueError as e:
            ds.problems.append(str(e))
    if not ds.tasks and not ds.problems:
        ds.problems.append(f"{path}: no task folders (each holds {INSTRUCTION}, {CONFIG}, {ENVIRONMENT}/, {TESTS}/)")
    if ds.problems and not skip_bad:
        raise DatasetError(str(path), ds.problems)
    return ds


def describe_tasks(path: str | Path, build_problems=None) -> tuple[list[str], int]:
    """`hermes-batch tasks list`: (a line per task with what it needs, or its problem; how many are bad).

    build_problems(context) -> [why it cannot build here] (a sandbox backend's); None: not asked.
    """
    lines, bad = [], 0
    path = Path(path)
    folders = task_folders(path) if path.is_dir() else []
    if not folders:
        return [f"{path}: no task folders"], 1
    for folder in folders:
        try:
            task = read_task(folder)
        except ValueError as e:
            lines.append(f"BAD   {e}")
            bad += 1
            continue
        f = task.row().task_folder
        env = task.config.environment
        image = env.docker_image or "-"
        build = (task.environment / "Dockerfile").is_file()
        needs = [f"image {image}" + (" (else built from environment/)" if build and env.docker_image else "")
                 if env.docker_image else "image built from environment/",
                 f"cpus {f.cpus:g}" if f.cpus else None, f"memory {f.memory_mb} MB" if f.memory_mb else None,
                 f"agent {f.agent_timeout:g}s" if f.agent_timeout else None,
                 f"verifier {f.verifier_timeout:g}s" if f.verifier_timeout else None,
                 "solution" if f.solution else "no solution/solve.sh"]
        problems = build_problems(str(task.environment)) if build and build_problems else []
        if problems:
            bad += 1
        head = "BAD  " if problems else "ok   "
        lines.append(f"{head} {task.name}: " + ", ".join(n for n in needs if n)
                     + "".join(f"\n        problem: {p}" for p in problems))
    return lines, bad
