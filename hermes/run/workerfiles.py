"""The run folder's workers/ files: one per process that runs the run's prompts on a Dask
worker, saying how many of its prompts are in flight (hermes/run/remote.py writes them through the
worker's InFlight). What a dead worker's file still counts may have left containers on its host;
hermes.run.status reports them. Light on purpose: `hermes-batch status` reads these.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from hermes.sandbox.lifecycle import owner_alive

from hermes.data.run_paths import RunPaths

log = logging.getLogger(__name__)


class InFlight:
    """Counts the worker's prompts in flight into its file in the run folder, so that what a
    killed worker left is known. It only counts: the run's slots (RunContext.slots) admit."""

    def __init__(self, path: Path, worker: str, sandboxed: bool):
        self._lock = threading.Lock()
        self.path = path
        self.worker = worker
        self.sandboxed = sandboxed  # a run whose prompts make no container leaves none behind
        self.count = 0
        self._write()

    def started(self) -> None:
        self._change(+1)

    def finished(self) -> None:
        self._change(-1)

    def _change(self, delta: int) -> None:
        with self._lock:
            self.count += delta
            if self.sandboxed:  # else nothing can be left behind: the file's first write says so
                self._write()

    def _write(self) -> None:
        host, _, pid = self.worker.rpartition(":")
        data = {"worker": self.worker, "host": host, "pid": int(pid), "in_flight": self.count,
                "sandboxed": self.sandboxed, "updated": time.time()}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        # No fsync: it must survive the process being killed (the page cache does), not the machine.
        try:
            tmp.write_text(json.dumps(data), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as e:  # a prompt must never fail over its bookkeeping
            log.warning("could not write %s: %s", self.path, e)


def worker_file(run_dir: Path, worker: str) -> Path:
    return RunPaths(run_dir).workers / (worker.replace(":", "_").replace("/", "_") + ".json")


def forget_dead_workers(run_dir: Path) -> None:
    """Worker files of dead processes on this host: their containers were just removed."""
    for path in (RunPaths(run_dir).workers).glob("*.json"):
        info = _read_worker(path)
        if info and owner_alive(info.get("worker")) is False:
            path.unlink(missing_ok=True)


def _read_worker(path: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def left_behind(run_dir: Path) -> list[dict[str, Any]]:
    """Workers whose file still counts prompts in flight: each may have left that many containers
    on its host. `alive` is True/False for this host's processes, None for another host's."""
    found = []
    for path in sorted((RunPaths(run_dir).workers).glob("*.json")):
        info = _read_worker(path)
        if info and info.get("in_flight") and info.get("sandboxed", True):
            found.append({"host": info.get("host"), "pid": info.get("pid"), "worker": info.get("worker"),
                          "in_flight": info["in_flight"], "alive": owner_alive(info.get("worker"))})
    return found
