"""A local Prefect server kept in the background, for command-line runs without PREFECT_API_URL.

Booting Prefect's ephemeral server costs every invocation about 9 s (boot, migrations check,
shutdown). Instead the first run starts `prefect server start` on 127.0.0.1 and a free port as a
detached process (its own session, log file and working directory under PREFECT_HOME), records
it in PREFECT_HOME/hermes-server.json, and later runs reuse it; its UI shows every run.

- A recorded server is reused only if its pid is still a `prefect server start` on the recorded
  port and that port answers /api/health; otherwise a fresh one starts on a free port.
- Starts are serialised by a file lock, so runs started at the same moment share one server.
- If no server can be started, the run falls back to the ephemeral server (one-line warning).
- HERMES_PREFECT_SERVER=ephemeral keeps the ephemeral server; a set PREFECT_API_URL wins over both.

This module imports no Prefect at load time: it must set PREFECT_API_URL before Prefect reads it.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from pydantic import BaseModel, ValidationError

from hermes.environment import read
from hermes.errors import HermesError

MODE_ENV = "HERMES_PREFECT_SERVER"  # background (default) | ephemeral
TIMEOUT_ENV = "HERMES_PREFECT_SERVER_TIMEOUT"  # seconds a fresh server may take to answer
STATE_FILE, LOCK_FILE, LOG_FILE = "hermes-server.json", "hermes-server.lock", "hermes-server.log"
HOST = "127.0.0.1"  # never anything else: the server has no authentication
_PASSED_ENV = {"PATH", "HOME", "USER", "LANG", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "SSL_CERT_FILE",
               "SSL_CERT_DIR"}
START_ATTEMPTS = 3  # a free port can be taken between choosing it and the server binding it


class ServerUnavailable(HermesError, RuntimeError):
    transient = True


class ServerState(BaseModel):
    """What hermes-server.json records of the background server."""
    url: str  # the UI; the API is url + "/api"
    pid: int
    port: int
    log_file: str
    started_at: datetime
    prefect_version: str = ""  # the Prefect it runs: after an upgrade, clients and server must agree
    #: the API address its UI was told to call; empty for servers started before it was set, whose
    #: UI called port 4200 whatever port they were on (a blank page, or another server's runs)
    ui_api_url: str = ""

    @property
    def api_url(self) -> str:
        return self.url + "/api"


def installed_prefect() -> str:
    from importlib.metadata import version

    return version("prefect")


def prefect_home() -> Path:
    # Prefect's own default; read from the environment so Prefect need not be imported yet.
    return Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()


def read_state(home: Path) -> ServerState | None:
    try:
        return ServerState.model_validate_json((home / STATE_FILE).read_text())
    except (OSError, ValidationError):
        return None


def _write_state(home: Path, state: ServerState) -> None:
    tmp = home / (STATE_FILE + ".tmp")
    tmp.write_text(state.model_dump_json(indent=2))
    tmp.replace(home / STATE_FILE)  # readers never see half a file


def is_ours(state: ServerState) -> bool:
    """The recorded pid is still a live `prefect server start` on the recorded port (not a reused pid)."""
    try:
        raw = Path(f"/proc/{state.pid}/cmdline").read_bytes()  # empty for a zombie
    except OSError:
        return False
    args = raw.decode(errors="replace").split("\0")
    return "prefect" in args and "server" in args and "start" in args and str(state.port) in args


def healthy(state: ServerState, timeout: float = 2.0) -> bool:
    """The recorded port answers Prefect's health check (not just any listener holding it)."""
    import httpx

    try:
        # trust_env=False: a check of our own loopback server never goes through a configured proxy
        answer = httpx.get(state.api_url + "/health", timeout=timeout, trust_env=False)
        return answer.status_code == 200 and answer.json() is True
    except (httpx.HTTPError, ValueError):
        return False


def alive(state: ServerState, tries: int = 3, timeout: float = 2.0) -> bool:
    # A few tries: a server busy with another run's writes may be slow to answer, and replacing
    # a live shared server would cut that run off it.
    return is_ours(state) and any(healthy(state, timeout) for _ in range(tries))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _kill(pid: int, grace: float = 20.0) -> None:
    """End the server's whole process group (it was started in a session of its own)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not running(pid):
                return
            time.sleep(0.1)


def running(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child, so it does not linger as a zombie
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    with open(home / LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _startup_timeout() -> float:
    return read("prefect_server_timeout")  # TIMEOUT_ENV, else PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive in the block take effect when it ends (main thread only:
    elsewhere Python delivers no signal anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    sigs = (signal.SIGINT, signal.SIGTERM)
    before = {sig: signal.signal(sig, lambda signum, _frame: held.append(signum)) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)  # now with its own handler (KeyboardInterrupt, or the default)


def _start(home: Path, timeout: float) -> ServerState:
    # Prefect's settings and the basics only: the server outlives this run and must not carry its
    # API keys (HERMES_API_KEY, tools' keys) in its environment for days.
    env = {k: v for k, v in os.environ.items()
           if (k.startswith("PREFECT_") and k != "PREFECT_API_URL") or k in _PASSED_ENV or k.startswith("LC_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    log = home / LOG_FILE
    deadline = time.monotonic() + timeout
    why = "no attempt"
    version = installed_prefect()
    for _ in range(START_ATTEMPTS):
        port = _free_port()
        # The UI is a page that calls the API from the browser: Prefect tells it where from these
        # settings, not from --port (3.9 answers /ui-settings with :4200 otherwise).
        env.update(PREFECT_SERVER_API_HOST=HOST, PREFECT_SERVER_API_PORT=str(port),
                   PREFECT_UI_API_URL=f"http://{HOST}:{port}/api", PREFECT_UI_URL=f"http://{HOST}:{port}")
        # Recorded at once: a run interrupted while waiting leaves a server the next run finds, not an
        # orphan. Ctrl-C between the start and the record would leave one nobody knows of: held back.
        with open(log, "ab") as out, _signals_held():
            out.write(f"--- {datetime.now(timezone.utc).isoformat()} starting on {HOST}:{port}\n".encode())
            out.flush()
            # A session of its own: Ctrl-C in the terminal of the run that started it does not reach it.
            proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", HOST,
                                     "--port", str(port), "--analytics-off"],
                                    cwd=home, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            state = ServerState(url=f"http://{HOST}:{port}", pid=proc.pid, port=port, log_file=str(log),
                                started_at=datetime.now(timezone.utc), prefect_version=version,
                                ui_api_url=env["PREFECT_UI_API_URL"])
            _write_state(home, state)
        while proc.poll() is None and time.monotonic() < deadline:
            if healthy(state):
                return state
            time.sleep(0.25)
        (home / STATE_FILE).unlink(missing_ok=True)
        if proc.poll() is None:  # out of time: do not leave it behind
            _kill(proc.pid, grace=5)
            raise ServerUnavailable(f"no answer from a Prefect server on {state.url} in {timeout:g}s (log: {log})")
        why = f"it exited with {proc.returncode} (log: {log})"
    raise ServerUnavailable(f"could not start a Prefect server: {why}")


def ensure(home: Path | None = None) -> tuple[ServerState, bool]:
    """The background server of this PREFECT_HOME, started if none answers; (state, started now)."""
    home = home or prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    with _locked(home):
        state = read_state(home)
        current = (state is not None and state.prefect_version == installed_prefect()
                   and state.ui_api_url == state.api_url)
        if current and alive(state):
            return state, False
        if state is not None and is_ours(state):
            _kill(state.pid)  # ours, but hung or of another Prefect: it would hold its port and memory for nothing
        return _start(home, _startup_timeout()), True


def stop(home: Path | None = None) -> tuple[ServerState | None, bool]:
    """Stop the recorded server (and its children) and forget it: (what was recorded, whether it ran)."""
    home = home or prefect_home()
    if not (home / STATE_FILE).exists():
        return None, False
    with _locked(home):
        state = read_state(home)
        ran = state is not None and is_ours(state)
        if ran:
            _kill(state.pid)
        (home / STATE_FILE).unlink(missing_ok=True)
        return state, ran


@contextlib.contextmanager
def for_this_run() -> Iterator[str | None]:
    """Point this process's Prefect at the background server for the duration of a CLI run.

    Yields the API URL in use, or None for Prefect's own choice (PREFECT_API_URL as set, or the
    ephemeral server). Must be entered before Prefect is imported; if it was imported already
    (a caller in-process), its settings are overridden for the block instead.
    """
    mode = read("prefect_server")  # MODE_ENV; a value other than background or ephemeral raises, naming it
    if os.environ.get("PREFECT_API_URL") or mode == "ephemeral":
        yield None
        return
    try:
        state, _ = ensure()
    except (ServerUnavailable, OSError) as e:
        print(f"warning: no background Prefect server ({e}); this run uses Prefect's ephemeral server",
              file=sys.stderr)
        yield None
        return
    print(f"Prefect UI: {state.url} (stop it with `hermes-batch server stop`)", flush=True)
    os.environ["PREFECT_API_URL"] = state.api_url  # also for the processes this run starts
    if "prefect" not in sys.modules:
        yield state.api_url
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: state.api_url}):
        yield state.api_url


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hermes-batch server",
                                description="The local Prefect server that command-line runs without "
                                            "PREFECT_API_URL use (under PREFECT_HOME, on 127.0.0.1).")
    p.add_argument("action", choices=("start", "status", "stop"))
    a = p.parse_args(argv)
    home = prefect_home()
    if a.action == "start":
        try:
            state, started = ensure(home)
        except ServerUnavailable as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"Prefect UI: {state.url} (pid {state.pid}, {'started' if started else 'already running'}; "
              f"log {state.log_file})")
        return 0
    if a.action == "status":
        state = read_state(home)
        if state is None:
            print(f"no background Prefect server recorded in {home / STATE_FILE}")
            return 0
        print(f"Prefect UI: {state.url}\npid:        {state.pid}\nalive:      {'yes' if alive(state, tries=1) else 'no'}"
              f"\nstarted:    {state.started_at.isoformat(timespec='seconds')}\nlog:        {state.log_file}")
        return 0
    state, ran = stop(home)
    if state is None:
        print("no background Prefect server to stop")
    else:
        print(f"{'stopped' if ran else 'forgot (it was not running)'} the Prefect server on {state.url} (pid {state.pid})")
    return 0
