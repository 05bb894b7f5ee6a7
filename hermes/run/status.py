"""What a run has done and still owes, read straight from its batch files.

It reads the journal with an in-memory DuckDB rather than the run's index file, so it works
while the run is active (DuckDB lets one process hold a database file).
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import duckdb

from hermes.data import journal
from hermes.run import rundir, workerfiles
from hermes.data.failures import group
from hermes.data.dataset import DatasetError
from hermes.data.sources import read_source
from hermes.data.entry import Status
from hermes.data.run_index import COLUMNS, load_dataset

_FAILED = f"'{Status.FAILED}'"  # as an SQL literal


def is_active(run_path: Path) -> bool:
    lock = run_path / ".lock"
    if not lock.exists():
        return False
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def run_status(run_path: Path) -> dict[str, Any]:
    if not run_path.is_dir():
        raise FileNotFoundError(f"no run folder {run_path}")
    manifest = rundir.read_manifest(run_path)
    files = [str(p) for _, p in journal.batch_files(run_path)]
    per_key: list[tuple] = []
    con = duckdb.connect()
    if files:
        con.execute(
            """CREATE TABLE o AS SELECT prompt_index, hermes.key AS key, hermes.status AS status, hermes.error AS error,
                      filename FROM read_json(?, format='newline_delimited', columns=?, ignore_errors=true, filename=true)
               WHERE hermes.key IS NOT NULL""", [files, COLUMNS])
        per_key = con.execute(
            f"""SELECT key,
                      coalesce(min(status) FILTER (WHERE status <> {_FAILED}), {_FAILED}) AS final,
                      count(*) FILTER (WHERE status = {_FAILED}) AS failures,
                      arg_max(error, filename) FILTER (WHERE status = {_FAILED}) AS last_error
               FROM o GROUP BY key""").fetchall()
    done = {k: final for k, final, _, _ in per_key if final != Status.FAILED}
    failed = {k: (n, err) for k, final, n, err in per_key if final == Status.FAILED}
    status: dict[str, Any] = {
        "run_name": manifest.get("run_name", run_path.name),
        "folder": str(run_path),
        "active": is_active(run_path),
        "dataset_file": manifest.get("dataset_file"),
        "batches": len(files),
        "done": len(done),
        "completed": sum(v == Status.COMPLETED for v in done.values()),
        "partial": sum(v == Status.PARTIAL for v in done.values()),
        "discarded_no_reasoning": sum(v == Status.DISCARDED for v in done.values()),
        "stopped_by_policy": sum(v == Status.STOPPED for v in done.values()),
        "failed": len(failed),
        "failed_attempts": sum(n for n, _ in failed.values()),
        "failure_reasons": group(err for _, err in failed.values()),  # by kind, with an example each
        "owed": None,
        # Dask workers whose last word was prompts in flight: each may have left that many
        # containers on its host (alive None: another host's process, liveness unknown here).
        "containers_maybe_left": workerfiles.left_behind(run_path),
    }
    settings = manifest.get("settings") or {}
    status["attempt_policy"] = settings.get("attempt_policy") or "all"
    dataset = manifest.get("dataset_file")
    if dataset:
        try:
            status["total_prompts"], status["owed"] = _owed(con, read_source(
                dataset, max_samples=settings.get("max_samples"), skip_bad=True,
                attempts=settings.get("attempts") or 1), bool(files))
        except DatasetError as e:
            status["dataset_problem"] = str(e).splitlines()[0]
    con.close()
    return status


def _owed(con: duckdb.DuckDBPyConnection, dataset, journal_read: bool) -> tuple[int, int]:
    """(rows, rows still owed): rows with no successful line in the journal, joined in DuckDB."""
    if not journal_read:
        return dataset.prompts, dataset.prompts
    load_dataset(con, dataset)
    owed = con.execute(f"""SELECT count(*) FROM dataset d WHERE NOT EXISTS
                             (SELECT 1 FROM o WHERE o.key = d.key AND o.status <> {_FAILED})""").fetchone()[0]
    return dataset.prompts, owed


def format_status(s: dict[str, Any]) -> str:
    lines = [f"run {s['run_name']} ({s['folder']}){' — running now' if s['active'] else ''}"]
    if "total_prompts" in s:
        lines.append(f"  prompts in dataset   {s['total_prompts']}  ({s['dataset_file']})")
    lines += [
        f"  done                 {s['done']}  (completed {s['completed']}, partial {s['partial']}, "
        f"discarded for no reasoning {s['discarded_no_reasoning']})",
        f"  failed               {s['failed']}  ({s['failed_attempts']} failed attempts; retried on --resume)",
        f"  owed                 {s['owed'] if s['owed'] is not None else 'unknown (dataset not readable)'}"
        + (f"  (at most: --attempt_policy {s['attempt_policy']} runs what the verdicts call for)"
           if s.get("attempt_policy", "all") != "all" else ""),
    ]
    if s.get("stopped_by_policy"):
        lines.insert(2, f"  stopped by policy    {s['stopped_by_policy']}  (in flight when a sibling passed)")
    for kind, g in s["failure_reasons"].items():
        lines.append(f"    {g['count']:>5} × {kind}  (e.g. {g['example'][:160]})")
    for w in s.get("containers_maybe_left") or []:
        if w["alive"] is True:
            state = "its worker is still running"
        else:
            state = "its worker is gone" if w["alive"] is False else "its worker on another host may be gone"
        lines.append(f"  containers may be left: {w['in_flight']} on host {w['host']} (worker pid {w['pid']}, {state}; "
                     f"that host's next start of this run or `hermes-batch sandbox cleanup` there removes them)")
    if s.get("dataset_problem"):
        lines.append(f"  dataset problem: {s['dataset_problem']}")
    return "\n".join(lines)
