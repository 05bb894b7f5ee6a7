"""JSONL dataset rows -> validated PromptRow, each with its content key.

A content key identifies a row by what it asks, not where it stands: a hash of prompt, image
and cwd, plus the occurrence number among identical rows. A reordered dataset keeps its keys;
a prompt listed three times has three keys and needs three completions.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
import json
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class DatasetError(ValueError):
    """The dataset cannot be used as it is; `problems` lists each bad line."""

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = problems
        shown = "\n".join(f"  {p}" for p in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{path}: {len(problems)} bad line(s), nothing was run:\n{shown}{more}")


class PromptRow(BaseModel):
    """One dataset line. Unknown fields are kept and carried into the trajectory's metadata."""

    model_config = ConfigDict(extra="allow", frozen=True)

    prompt: str = Field(min_length=1)
    image: str | None = None
    docker_image: str | None = None
    cwd: str | None = None

    @model_validator(mode="after")
    def _one_image(self):
        if self.image and self.docker_image and self.image != self.docker_image:
            raise ValueError("'image' and 'docker_image' disagree; give one")
        return self

    @property
    def container_image(self) -> str | None:
        return self.image or self.docker_image

    @property
    def extra(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


@dataclass(frozen=True, slots=True)
class Row:
    """A row placed in the run: its index among the dataset's rows, its line and content key."""

    index: int
    line: int
    key: str
    row: PromptRow


def content_hash(row: PromptRow) -> str:
    # repr of a tuple of str/None is unambiguous and cheap (json.dumps was most of planning's time).
    payload = repr((row.prompt, row.container_image, row.cwd))
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        field = ".".join(str(x) for x in e["loc"]) or "row"
        parts.append(f"field '{field}': {e['msg']}")
    return "; ".join(parts)


def load_rows(path: str | Path, *, max_samples: int | None = None, skip_bad: bool = False) -> tuple[list[Row], list[str]]:
    """Read and validate the whole file before anything runs.

    Returns (rows, problems). Raises DatasetError when there are problems and not skip_bad.
    Blank lines are ignored, as by the reference system.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(str(path), [f"{path}: no such file"])
    rows: list[Row] = []
    problems: list[str] = []
    seen: Counter[str] = Counter()
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if max_samples is not None and len(rows) >= max_samples:
                break
            if not raw.strip():
                continue
            try:
                # Fast path: pydantic parses and validates in one go (a million rows in seconds).
                row = PromptRow.model_validate_json(raw)
            except ValidationError:
                row = None
            if row is None:
                problem = _problem(raw, path, lineno)
                if problem:
                    problems.append(problem)
                    continue
                row = PromptRow.model_validate(json.loads(raw))
            h = content_hash(row)
            occurrence = seen[h]
            seen[h] += 1
            rows.append(Row(index=len(rows), line=lineno, key=f"{h}-{occurrence}", row=row))
    if problems and not skip_bad:
        raise DatasetError(str(path), problems)
    return rows, problems


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
