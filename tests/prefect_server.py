"""A real `prefect server start` on a free loopback port, for tests of deployments, workers and jobs.

    with running_prefect_server(tmp_path) as server:
        env = server.env          # PREFECT_API_URL and PREFECT_HOME for subprocesses (CLI, workers)
        server.api_url            # http://127.0.0.1:PORT/api

Its SQLite database lives under the given folder; the server is stopped (process group) on exit.
Every server starts from a copy of one empty database migrated once per session
(`migrated_database()`, also used by tests/flows/test_local_server.py), so its `prefect server start`
finds the schema current and only checks it (~3 s of each boot otherwise).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx

from tests.helpers import free_port


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


_MIGRATED: Path | None = None


def migrated_database() -> Path:
    """An empty Prefect database with every migration applied, made once per session
    (`prefect server database upgrade`); callers copy it, so each server has only its own data."""
    global _MIGRATED
    if _MIGRATED is None:
        folder = Path(tempfile.mkdtemp(prefix="prefect-migrated-"))
        atexit.register(shutil.rmtree, folder, True)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}, "PREFECT_HOME": str(folder)}
        done = subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
                              env=env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not (folder / "prefect.db").exists():
            raise RuntimeError(f"prefect server database upgrade failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        _MIGRATED = folder / "prefect.db"
    return _MIGRATED


@contextlib.contextmanager
def running_prefect_server(home: Path, startup_timeout: float = 180,
                           extra_env: dict[str, str] | None = None) -> Iterator[PrefectServer]:
    home.mkdir(parents=True, exist_ok=True)
    db = home / "prefect.db"
    if not db.exists():
        shutil.copyfile(migrated_database(), db)
    log = home / "server.log"
    tries = 3  # the free port found can be taken by a test beside this one before the server binds it

    def start() -> tuple[str, dict[str, str], subprocess.Popen]:
        port = free_port()
        api_url = f"http://127.0.0.1:{port}/api"
        env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": api_url,
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false",
               "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{db}",
               "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore", **(extra_env or {})}
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                     "--port", str(port), "--analytics-off", "--no-ui"],
                                    env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return api_url, env, proc

    api_url, env, proc = start()
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None and tries > 1 and "already in use" in log.read_text():
                tries -= 1
                api_url, env, proc = start()
                continue
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
        yield PrefectServer(api_url=api_url, env=env, log=log, proc=proc)
    finally:
        PrefectServer(api_url=api_url, env=env, log=log, proc=proc).stop()
