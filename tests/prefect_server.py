"""A real `prefect server start` on a free loopback port, for tests of deployments, workers and jobs.

    with running_prefect_server(tmp_path) as server:
        env = server.env          # PREFECT_API_URL and PREFECT_HOME for subprocesses (CLI, workers)
        server.api_url            # http://127.0.0.1:PORT/api

Its SQLite database lives under the given folder; the server is stopped (process group) on exit.
The first server of a test session migrates its database from nothing (~3 s of the boot); later
ones start from a copy of that freshly migrated database, so their `prefect server start` finds
the schema current and only checks it.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx


@dataclass
class PrefectServer:
    api_url: str
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen | None = None

    def stop(self) -> None:
        """Stop the server now (its process group), as if it went away under its clients."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


_MIGRATED: Path | None = None  # a copy of the first server's database, taken once it answered


def _keep_migrated(db: Path) -> None:
    """Copy the just-booted server's database (sqlite's online backup: consistent while it runs)."""
    global _MIGRATED
    folder = Path(tempfile.mkdtemp(prefix="prefect-migrated-"))
    atexit.register(shutil.rmtree, folder, True)
    copy = folder / "prefect.db"
    with contextlib.closing(sqlite3.connect(db)) as src, contextlib.closing(sqlite3.connect(copy)) as dst:
        src.backup(dst)
    _MIGRATED = copy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_prefect_server(home: Path, startup_timeout: float = 180,
                           extra_env: dict[str, str] | None = None) -> Iterator[PrefectServer]:
    home.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    db = home / "prefect.db"
    fresh = _MIGRATED is None or db.exists()
    if not fresh:
        shutil.copyfile(_MIGRATED, db)
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": api_url,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false",
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{db}",
           "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore", **(extra_env or {})}
    log = home / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                 "--port", str(port), "--analytics-off", "--no-ui"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prefect server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prefect server did not answer in {startup_timeout}s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        if fresh and _MIGRATED is None:
            _keep_migrated(db)
        yield PrefectServer(api_url=api_url, env=env, log=log, proc=proc)
    finally:
        PrefectServer(api_url=api_url, env=env, log=log, proc=proc).stop()
