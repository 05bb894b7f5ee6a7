"""JSONL dataset rows -> validated PromptRow, each with its content key.

A content key identifies a row by what it asks, not where it stands: a hash of prompt, image
and cwd, plus the occurrence number among identical rows. A reordered dataset keeps its keys;
a prompt listed three times has three keys and needs three completions.

A whole dataset is checked before anything runs, but kept small (hermes.data.dataset.Dataset): per
row its line, byte offset and hash, 32 bytes. A row's PromptRow is built again from its line
when the row is owed; a million rows of which 1% are owed build 10,000 of them.
"""
from __future__ import annotations

import hashlib
import json
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import from_json

from hermes.errors import HermesError


class DatasetError(HermesError, ValueError):
    """The dataset cannot be used as it is; `problems` lists each bad line."""

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = problems
        shown = "\n".join(f"  {p}" for p in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{path}: {len(problems)} bad line(s), nothing was run:\n{shown}{more}")


class TaskFolder(BaseModel):
    """What a row read from a Harbor task folder (hermes.data.harbor) needs besides its prompt.

    Not in the trajectory or its metadata. Paths are the host's; tests/ reaches the sandbox only
    once the agent has finished, solution/ only in `hermes-batch verify`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    folder: str
    tests: str
    solution: str | None = None
    agent_timeout: float | None = Field(None, gt=0)
    verifier_timeout: float | None = Field(None, gt=0)
    build_timeout: float | None = Field(None, gt=0)
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    storage_mb: int | None = Field(None, gt=0)


class PromptRow(BaseModel):
    """One dataset line. Unknown fields are kept and carried into the trajectory's metadata.

    `files`, `setup` and `check` prepare and judge the prompt's sandbox (hermes.data.task); they are
    neither shown to the model nor part of the trajectory or its metadata.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    prompt: str = Field(min_length=1)
    image: str | None = None
    docker_image: str | None = None
    cwd: str | None = None
    files: dict[str, str] | None = Field(None, description="path (relative: to the cwd) -> text, placed in the "
                                         "sandbox before the agent starts")
    setup: str | list[str] | None = Field(None, description="command(s) run in the sandbox before the agent "
                                          "starts; one failing fails the prompt")
    check: str | None = Field(None, min_length=1, description="command run in the sandbox after the agent "
                              "finishes: its exit code and output are the entry's reward")
    build: str | None = Field(None, min_length=1, description="a folder with a Dockerfile (relative paths: to the "
                              "dataset's folder): the row's image is built from it, once per content hash; with "
                              "`image` too, that image is used where the engine has it or can pull it")
    task_folder: TaskFolder | None = Field(None, description="set for rows read from a Harbor task folder")

    @model_validator(mode="after")
    def _one_image(self):
        if self.image and self.docker_image and self.image != self.docker_image:
            raise ValueError("'image' and 'docker_image' disagree; give one")
        return self

    @field_validator("setup")
    @classmethod
    def _commands(cls, v):
        if isinstance(v, list) and not all(c.strip() for c in v):
            raise ValueError("setup commands must not be empty")
        if isinstance(v, str) and not v.strip():
            raise ValueError("setup must not be empty")
        return v

    @property
    def setup_commands(self) -> list[str]:
        return [self.setup] if isinstance(self.setup, str) else list(self.setup or [])

    @property
    def has_task(self) -> bool:
        """Does the row prepare or check its sandbox (so it needs one whatever the tools)?"""
        return bool(self.files or self.setup or self.check or self.task_folder)

    @property
    def container_image(self) -> str | None:
        return self.image or self.docker_image

    @property
    def extra(self) -> dict[str, Any]:
        extra = dict(self.model_extra or {})
        if self.task_folder is not None:
            extra.setdefault("task", self.task_folder.name)
        return extra


@dataclass(frozen=True, slots=True)
class Row:
    """A row placed in the run: its index among the dataset's rows, its line and content key.

    `trial`: which of the run's --attempts this is (1..K); its key is the row's own for the first,
    `<key>#a<n>` for the n-th (attempt_key), so raising --attempts on a resume keeps what ran.
    """

    index: int
    line: int
    key: str
    row: PromptRow
    trial: int = 1


#: separates a row's key from its attempt number in the keys of attempts 2..K
ATTEMPT_MARK = "#a"


def attempt_key(key: str, trial: int) -> str:
    return key if trial == 1 else f"{key}{ATTEMPT_MARK}{trial}"


def split_attempt(key: str) -> tuple[str, int]:
    """(the row's key, which attempt) of an attempt's key."""
    base, mark, n = key.rpartition(ATTEMPT_MARK)
    return (base, int(n)) if mark and n.isdigit() else (key, 1)


def content_hash(row: PromptRow) -> str:
    return _row_digest(row).hex()


def _row_digest(row: PromptRow) -> bytes:
    if row.build is None:
        return _digest(row.prompt, row.container_image, row.cwd)
    # a built image is part of what the row asks (rows without one keep their keys unchanged)
    return _digest(row.prompt, f"{row.container_image}|build:{row.build}", row.cwd)


def _digest(prompt: str, image: str | None, cwd: str | None) -> bytes:
    # repr of a tuple of str/None is unambiguous and cheap (json.dumps was most of planning's time).
    # Keys are persisted in users' runs: this must never change. 16 bytes = the key's 32 hex digits.
    payload = repr((prompt, image, cwd))
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).digest()[:16]


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        field = ".".join(str(x) for x in e["loc"]) or "row"
        parts.append(f"field '{field}': {e['msg']}")
    return "; ".join(parts)


_HASH = 16  # bytes of a row's hash kept in a Dataset


@dataclass
class Dataset:
    """A checked dataset, kept small: per row its line number, byte offset and content hash."""

    path: Path
    problems: list[str] = field(default_factory=list)
    lines: array = field(default_factory=lambda: array("q"))
    offsets: array = field(default_factory=lambda: array("q"))
    hashes: bytearray = field(default_factory=bytearray)
    #: times each row is run (--attempts): attempt n of a row is its own prompt, with its own key
    attempts: int = 1

    def __len__(self) -> int:
        return len(self.lines)

    @property
    def prompts(self) -> int:
        """Prompts the dataset asks for: every attempt of every row."""
        return len(self) * self.attempts

    def hash_chunks(self, size: int = 100_000) -> Iterator[tuple[int, str]]:
        """(first row, comma-separated hex hashes) of `size` rows at a time (for DuckDB, hermes.data.run_index)."""
        for start in range(0, len(self), size):
            yield start, self.hashes[start * _HASH:(start + size) * _HASH].hex(",", _HASH)

    def keys(self) -> list[str]:
        """Every row's content key, in dataset order (hermes.data.run_index.load_dataset numbers them alike in SQL)."""
        seen: Counter[bytes] = Counter()
        keys = []
        for i in range(len(self)):
            h = bytes(self.hashes[i * _HASH:(i + 1) * _HASH])
            keys += [attempt_key(f"{h.hex()}-{seen[h]}", n) for n in range(1, self.attempts + 1)]
            seen[h] += 1
        return keys

    def indexed_keys(self) -> list[tuple[int, str]]:
        """(row index, key) of every prompt (each attempt of each row), in dataset order."""
        keys = self.keys()
        return [(i // self.attempts, k) for i, k in enumerate(keys)]

    def rows(self, wanted: Iterable[tuple[int, str]]) -> list[Row]:
        """Full rows for (index, key) pairs, read again from the file.

        A line that no longer hashes as it did when the dataset was checked (the file changed
        under the run) is refused: its key would name another prompt.
        """
        out = []
        with self.path.open("rb") as f:
            for index, key in wanted:
                f.seek(self.offsets[index])
                row = _validated(f.readline())
                if row is not None and row.build is not None:
                    row = _resolve_build(row, self.path)
                if row is None or _row_digest(row) != self._hash(index):
                    raise DatasetError(str(self.path), [f"{self.path}:{self.lines[index]}: changed since the "
                                                        "dataset was checked; run again to check it anew"])
                out.append(Row(index=index, line=self.lines[index], key=key, row=row, trial=split_attempt(key)[1]))
        return out

    def _hash(self, index: int) -> bytes:
        return bytes(self.hashes[index * _HASH:(index + 1) * _HASH])


def _resolve_build(row: PromptRow, path: Path) -> PromptRow:
    """A row's `build` folder as an absolute path: relative ones are relative to the dataset's folder."""
    build = Path(row.build)
    if not build.is_absolute():
        build = (path.parent / build).resolve()
    return row.model_copy(update={"build": str(build)})


def read_dataset(path: str | Path, *, max_samples: int | None = None, skip_bad: bool = False,
                 attempts: int = 1) -> Dataset:
    """Read and check the whole file before anything runs; keep 32 bytes a row.
    (A folder of task folders is read by hermes.data.sources, which dispatches on what the path is.)

    Raises DatasetError listing every bad line when there are some and not skip_bad (then
    they are in .problems). Blank lines are ignored, as by the reference system.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(str(path), [f"{path}: no such file"])
    ds = Dataset(path, attempts=attempts)
    offset = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            if max_samples is not None and len(ds) >= max_samples:
                break
            if not raw.strip():
                continue
            fields = _fields(raw)
            if fields is None:
                problem = _problem(raw, path, lineno)
                if problem:
                    ds.problems.append(problem)
                    continue
                row = PromptRow.model_validate(json.loads(raw))
                if row.task_folder is not None:
                    ds.problems.append(f"{path}:{lineno}: field 'task_folder': set only for rows read from task "
                                       "folders (give --dataset_file the folder)")
                    continue
                if row.build is not None:
                    row = _resolve_build(row, path)
                    if not (Path(row.build) / "Dockerfile").is_file():
                        ds.problems.append(f"{path}:{lineno}: field 'build': no Dockerfile in {row.build}")
                        continue
                digest = _row_digest(row)
            else:
                digest = _digest(*fields)
            ds.lines.append(lineno)
            ds.offsets.append(start)
            ds.hashes += digest
    if ds.problems and not skip_bad:
        raise DatasetError(str(path), ds.problems)
    return ds


def load_rows(path: str | Path, *, max_samples: int | None = None, skip_bad: bool = False,
              attempts: int = 1) -> tuple[list[Row], list[str]]:
    """Every row (every attempt of it) as a full Row (for small datasets and tests; runs use read_dataset).

    Returns (rows, problems). Raises DatasetError when there are problems and not skip_bad.
    """
    ds = read_dataset(path, max_samples=max_samples, skip_bad=skip_bad, attempts=attempts)
    return ds.rows(ds.indexed_keys()), ds.problems


def _fields(raw: bytes) -> tuple[str, str | None, str | None] | None:
    """(prompt, container image, cwd) of a line PromptRow accepts; None for any doubt.

    The fast path: pydantic_core's parser and the checks PromptRow makes, without building the
    model (building two models a row was most of planning's time). Anything unusual goes the
    slow way (_problem and PromptRow), so what is accepted and what is reported do not change.
    """
    try:
        data = from_json(raw)
    except ValueError:
        return None
    if type(data) is not dict or _TASK_FIELDS & data.keys():  # rows that set up or check: the model checks them
        return None
    prompt, image, docker_image, cwd = (data.get(k) for k in ("prompt", "image", "docker_image", "cwd"))
    if type(prompt) is not str or not prompt:
        return None
    if any(v is not None and type(v) is not str for v in (image, docker_image, cwd)):
        return None
    if image and docker_image and image != docker_image:
        return None
    return prompt, image or docker_image, cwd


_TASK_FIELDS = frozenset(("files", "setup", "check", "build", "task_folder"))


def _validated(raw: bytes) -> PromptRow | None:
    try:
        return PromptRow.model_validate_json(raw)
    except ValidationError:
        pass
    try:  # what the JSON parser of pydantic refuses, json accepts (as read_dataset does)
        return PromptRow.model_validate(json.loads(raw))
    except (ValueError, ValidationError):
        return None


def _problem(raw: bytes, path: Path, lineno: int) -> str | None:
    """Why a line is bad, in words that name the line and the field (the slow path, bad lines only)."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return f"{path}:{lineno}: not UTF-8 (byte {e.start})"
    except json.JSONDecodeError as e:
        return f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})"
    if not isinstance(data, dict):
        return f"{path}:{lineno}: expected a JSON object, got {type(data).__name__}"
    try:
        PromptRow.model_validate(data)
    except ValidationError as e:
        return f"{path}:{lineno}: {_describe(e)}"
    return None
