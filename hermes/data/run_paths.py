"""The files of one run folder, data/<run_name>/, named in one place (as Harbor's TrialPaths names a trial's).

    paths = RunPaths(Path("data") / "my_run")
    paths.batch(3)          data/my_run/batch_3.jsonl      the journal: one file per batch
    paths.trajectories      trajectories.jsonl             derived: the merge's output
    paths.statistics        statistics.json                derived
    paths.checkpoint        checkpoint.json                derived, in the reference's shape
    paths.index             index.duckdb                   derived: the run's DuckDB index
    paths.view_index        view.duckdb                    derived: the viewer's index (hermes.view)
    paths.manifest          run.json                       what the run was started with
    paths.invocations       invocations.jsonl              one line per invocation (its seconds)
    paths.lock              .lock                          held by the invocation running the run
    paths.workers           workers/                       prompts in flight of each worker process

Tools keep their own folders beside these (images/, web_cache/: hermes/tools).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

BATCH_GLOB = "batch_*.jsonl"
BATCH_RE = re.compile(r"^batch_(\d+)\.jsonl$")


def batch_name(num: int) -> str:
    return f"batch_{num}.jsonl"


def batch_num(name: str) -> int | None:
    """The batch number a journal file's name carries; None for any other file."""
    m = BATCH_RE.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @classmethod
    def of(cls, output_dir: str | Path, run_name: str) -> "RunPaths":
        return cls(Path(output_dir) / run_name)

    def batch(self, num: int) -> Path:
        return self.root / batch_name(num)

    def batch_files(self) -> list[tuple[int, Path]]:
        """The journal's files on disk, by batch number."""
        return sorted((n, p) for p in self.root.glob(BATCH_GLOB) if (n := batch_num(p.name)) is not None)

    def batch_sizes(self) -> dict[int, int]:
        """The journal's files on disk: their sizes by batch number (numbers, not Path objects: a
        run of a million prompts has 100,000 files)."""
        sizes = {}
        with os.scandir(self.root) as entries:
            for e in entries:
                if (n := batch_num(e.name)) is not None and e.is_file():
                    try:
                        sizes[n] = e.stat().st_size
                    except FileNotFoundError:
                        pass
        return sizes

    @property
    def trajectories(self) -> Path:
        return self.root / "trajectories.jsonl"

    @property
    def statistics(self) -> Path:
        return self.root / "statistics.json"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint.json"

    @property
    def index(self) -> Path:
        return self.root / "index.duckdb"

    @property
    def view_index(self) -> Path:
        return self.root / "view.duckdb"

    @property
    def manifest(self) -> Path:
        return self.root / "run.json"

    @property
    def invocations(self) -> Path:
        return self.root / "invocations.jsonl"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def workers(self) -> Path:
        return self.root / "workers"
