"""The run folder data/<run_name>/: its manifest, lock, checkpoint and invocation log."""
from __future__ import annotations

import fcntl
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Iterator

from hermes.errors import HermesError
from hermes.data.run_paths import RunPaths
from hermes.data import journal
from hermes.settings import RunSettings


class RunRefused(HermesError):
    """The run cannot start as asked (existing run without --resume, run already active, ...)."""


def run_dir(settings: RunSettings) -> Path:
    return RunPaths.of(settings.output_dir, settings.run_name).root


def has_results(path: Path) -> bool:
    return bool(journal.batch_files(path))


class RunLock:
    """An exclusive lock on the run folder, held for a whole invocation; released if the process dies."""

    def __init__(self, path: Path):
        self.path = RunPaths(path).lock
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self.path.read_text().strip() or "another process"
            raise RunRefused(f"run folder {self.path.parent} is in use by {holder}; "
                             "two runs of the same run_name cannot run at once") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def write_manifest(path: Path, settings: RunSettings, total_prompts: int) -> None:
    """What merge needs to know about the run without the dataset at hand."""
    manifest = {"run_name": settings.run_name, "distribution": settings.distribution,
                "batch_size": settings.batch_size, "model": settings.model,
                "dataset_file": settings.dataset_file, "total_prompts": total_prompts,
                "settings": settings.model_dump(mode="json")}
    journal.write_atomic(RunPaths(path).manifest, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        return json.loads(RunPaths(path).manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"run_name": path.name}


def log_invocation(path: Path, started: datetime, finished: datetime, prompts_run: int) -> None:
    journal.append(RunPaths(path).invocations, {
        "started": started.isoformat(timespec="seconds"), "finished": finished.isoformat(timespec="seconds"),
        "seconds": round((finished - started).total_seconds(), 3), "prompts_run": prompts_run})


def total_seconds(path: Path) -> float:
    f = RunPaths(path).invocations
    return round(sum(e.get("seconds", 0) for e in journal.read(f)), 3) if f.exists() else 0.0


def write_checkpoint(path: Path, run_name: str, completed: Iterable[list[int]],
                     batch_stats: Iterable[list[tuple[int, int, int, int]]]) -> None:
    """checkpoint.json with the reference's keys, as json.dumps(indent=2) lays it out except for
    `completed_prompts`, on one line (a million indices indented one a line cost a second and 7 MB more).

    completed: the sorted dataset indices done, in chunks; batch_stats: (batch, processed, skipped,
    discarded) rows in chunks (hermes.data.run_index). Both are written as they come, so a run of a
    million prompts never holds its checkpoint as one string or one dict.
    """
    def pieces() -> Iterator[str]:
        yield f'{{\n  "run_name": {json.dumps(run_name)},\n  "completed_prompts": ['
        sep = ""
        for chunk in completed:
            if chunk:
                yield sep + ",".join(map(str, chunk))
                sep = ","
        yield '],\n  "batch_stats": {'
        sep = "\n"
        for chunk in batch_stats:
            for b, n, failed, discarded in chunk:
                yield (f'{sep}    "{b}": {{\n      "processed": {n},\n      "skipped": {failed},\n'
                       f'      "discarded_no_reasoning": {discarded}\n    }}')
                sep = ",\n"
        yield ("\n  }" if sep != "\n" else "}") + f',\n  "last_updated": {json.dumps(datetime.now().isoformat(timespec="seconds"))}\n}}\n'

    journal.write_atomic(RunPaths(path).checkpoint, pieces())
