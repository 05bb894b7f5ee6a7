"""Where a run's rows come from: a JSONL file (hermes.data.dataset) or a folder of Harbor task
folders (hermes.data.harbor). Both give the same small interface: problems, len, prompts (rows
times --attempts), hash_chunks, keys, indexed_keys and rows (the Rows owed)."""
from __future__ import annotations

from pathlib import Path

from hermes.data.dataset import Dataset, Row, read_dataset
from hermes.data.harbor import TaskDataset, read_tasks


def read_source(path: str | Path, *, max_samples: int | None = None, skip_bad: bool = False,
                attempts: int = 1) -> Dataset | TaskDataset:
    """The dataset `path` names, checked whole before anything runs (DatasetError lists what is bad)."""
    reader = read_tasks if Path(path).is_dir() else read_dataset
    return reader(path, max_samples=max_samples, skip_bad=skip_bad, attempts=attempts)


def load_source_rows(path: str | Path, *, max_samples: int | None = None, skip_bad: bool = False,
                     attempts: int = 1) -> tuple[list[Row], list[str]]:
    """Every prompt (each attempt of each row) as a full Row, and the problems skipped."""
    ds = read_source(path, max_samples=max_samples, skip_bad=skip_bad, attempts=attempts)
    return ds.rows(ds.indexed_keys()), ds.problems
