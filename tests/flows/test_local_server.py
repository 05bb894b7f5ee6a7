"""The default CLI path's local Prefect server: started once in the background, reused, replaced
when it died or lost its port, shared by runs started together, stopped on request.

Real `hermes-batch` processes (`python -m flows.cli`) against the bundled model server; each test
has a PREFECT_HOME of its own (passed in the subprocesses' environment) and stops its server at
the end. Runs need no sandbox (one answer, no tool call), so no container is started. Processes
are found through /proc: a `prefect server start` whose environment names the test's PREFECT_HOME.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from flows import local_server
from hermes.settings import API_KEY_ENV_VARS
from tests.helpers import script, until, write_dataset
from tests.prefect_server import migrated_database

pytestmark = pytest.mark.prefect

ANSWER = {"reasoning": "Nothing to run.", "content": "Answered."}
UI_LINE = re.compile(r"^Prefect UI: (http://127\.0\.0\.1:(\d+)) \(stop it with `hermes-batch server stop`\)$", re.M)


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "prefect-home"
    home.mkdir()
    # from one migrated empty database: seconds less per server, and still only this test's data
    shutil.copyfile(migrated_database(), home / "prefect.db")
    yield home
    local_server.stop(home)
    for pid in servers_of(home):  # a test that failed half-way may have left one unrecorded
        os.killpg(pid, signal.SIGKILL)


def env_for(home: Path, **extra: str) -> dict[str, str]:
    drop = {*API_KEY_ENV_VARS, "HERMES_ENGINE", "PREFECT_API_URL", local_server.MODE_ENV, local_server.TIMEOUT_ENV}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PREFECT_HOME": str(home), **extra}


def cli(cwd: Path, home: Path, *args: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env_for(home, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def start_run(tmp_path: Path, home: Path, name: str, base_url: str, **extra: str) -> subprocess.Popen:
    dataset = write_dataset(tmp_path / f"{name}.jsonl", [{"prompt": f"{name} {i} " + script(ANSWER)} for i in range(2)])
    return cli(tmp_path, home, "run", f"--dataset_file={dataset}", "--batch_size=1", f"--run_name={name}",
               f"--base_url={base_url}", "--model=mock-model", "--api_key=k", "--num_workers=2", "--engine=prefect",
               "--sandbox_backend=local", "--sandbox_prefetch=false",
               "--max_no_tool_use_share=1", **extra)  # prose answers: a dataset of questions that merely offers tools


def finished(proc: subprocess.Popen, timeout: float = 600) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    return out, err


def run_ok(tmp_path: Path, home: Path, name: str, base_url: str, **extra: str) -> tuple[str, str]:
    out, err = finished(start_run(tmp_path, home, name, base_url, **extra))
    assert (tmp_path / "data" / name / "trajectories.jsonl").read_text().count("\n") == 2
    return out, err


def ui_of(stdout: str) -> tuple[str, int]:
    found = UI_LINE.findall(stdout)
    assert len(found) == 1, stdout[-3000:]  # printed once
    return found[0][0], int(found[0][1])


def servers_of(home: Path) -> list[int]:
    """Pids of every `prefect server start` process (and child) running with this PREFECT_HOME."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"prefect" in cmd and b"server" in cmd and f"PREFECT_HOME={home}".encode() in environ:
            pids.append(int(proc.name))
    return sorted(pids)


def flow_runs(url: str) -> dict[str, str]:
    """Flow-run name -> state type, read from the server through Prefect's client."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url + "/api"}):
        with get_client(sync_client=True) as client:
            return {r.name: r.state_type.value for r in client.read_flow_runs()}


def recorded(home: Path) -> local_server.ServerState:
    state = local_server.read_state(home)
    assert state is not None, list(home.iterdir())
    return state


def kill_9(pid: int) -> None:
    os.killpg(pid, signal.SIGKILL)
    until(lambda: not local_server.running(pid), "the killed server to be gone", timeout=60)


def test_the_first_run_starts_a_server_and_the_next_run_reuses_it(tmp_path, home, mock_llm):
    key = f"sk-{secrets.token_hex(8)}"
    out, _ = run_ok(tmp_path, home, "first", mock_llm.base_url, OPENAI_API_KEY=key)
    url, port = ui_of(out)
    state = recorded(home)
    assert (state.url, state.port) == (url, port) and servers_of(home) == [state.pid]
    assert key.encode() not in Path(f"/proc/{state.pid}/environ").read_bytes()  # the server outlives the run
    assert flow_runs(url) == {"batch-first": "COMPLETED"}  # the run was a flow run on that server

    out, _ = run_ok(tmp_path, home, "second", mock_llm.base_url)
    assert ui_of(out) == (url, port)
    assert recorded(home).pid == state.pid and servers_of(home) == [state.pid]  # no new server
    assert flow_runs(url) == {"batch-first": "COMPLETED", "batch-second": "COMPLETED"}


def test_a_killed_server_is_replaced_and_a_taken_port_is_avoided(tmp_path, home, mock_llm):
    run_ok(tmp_path, home, "before", mock_llm.base_url)
    dead = recorded(home)
    kill_9(dead.pid)

    out, _ = run_ok(tmp_path, home, "after-kill", mock_llm.base_url)
    second = recorded(home)
    assert second.pid != dead.pid and servers_of(home) == [second.pid] and ui_of(out)[1] == second.port

    kill_9(second.pid)
    squatter = until(lambda: listener_on(second.port), f"port {second.port} to be free for the test's listener")
    with squatter:  # a plain listener of the test's own, not a Prefect server
        out, _ = run_ok(tmp_path, home, "port-taken", mock_llm.base_url)
        third = recorded(home)
        assert third.port != second.port and ui_of(out)[1] == third.port
        assert servers_of(home) == [third.pid]
    # Read only now: a client connection of this process to a server killed under it would hold
    # that server's port (FIN_WAIT2) for a minute. All three servers kept one database.
    assert flow_runs(third.url) == {"batch-before": "COMPLETED", "batch-after-kill": "COMPLETED",
                                    "batch-port-taken": "COMPLETED"}


def listener_on(port: int) -> socket.socket | None:
    try:
        return socket.create_server(("127.0.0.1", port))
    except OSError:
        return None


def test_server_start_status_stop(tmp_path, home):
    out, _ = finished(cli(tmp_path, home, "server", "start"))
    state = recorded(home)
    assert f"Prefect UI: {state.url} (pid {state.pid}, started;" in out
    assert servers_of(home) == [state.pid]
    out, _ = finished(cli(tmp_path, home, "server", "status"))
    assert re.search(rf"^Prefect UI: {state.url}$", out, re.M) and re.search(rf"^pid:\s+{state.pid}$", out, re.M)
    assert re.search(r"^alive:\s+yes$", out, re.M), out
    assert "already running" in finished(cli(tmp_path, home, "server", "start"))[0]

    out, _ = finished(cli(tmp_path, home, "server", "stop"))
    assert f"stopped the Prefect server on {state.url} (pid {state.pid})" in out
    assert servers_of(home) == [] and local_server.read_state(home) is None
    # nothing to stop or show: still success
    assert "no background Prefect server to stop" in finished(cli(tmp_path, home, "server", "stop"))[0]
    assert "no background Prefect server recorded" in finished(cli(tmp_path, home, "server", "status"))[0]


def test_two_runs_started_together_share_one_server(tmp_path, home, mock_llm):
    procs = [start_run(tmp_path, home, name, mock_llm.base_url) for name in ("left", "right")]
    urls = {ui_of(finished(p)[0]) for p in procs}
    assert len(urls) == 1, urls
    state = recorded(home)
    assert servers_of(home) == [state.pid] and urls == {(state.url, state.port)}
    assert flow_runs(state.url) == {"batch-left": "COMPLETED", "batch-right": "COMPLETED"}


def test_ephemeral_opt_out_and_the_fallback_when_no_server_starts(tmp_path, home, mock_llm):
    out, _ = run_ok(tmp_path, home, "opted-out", mock_llm.base_url, HERMES_PREFECT_SERVER="ephemeral")
    assert "Prefect UI:" not in out and local_server.read_state(home) is None and servers_of(home) == []

    # A server that cannot answer in time: the run warns once and still runs, on the ephemeral server.
    out, err = run_ok(tmp_path, home, "fallback", mock_llm.base_url, HERMES_PREFECT_SERVER_TIMEOUT="0.05")
    assert "Prefect UI:" not in out
    assert len(re.findall(r"^warning: no background Prefect server \(.*\); this run uses Prefect's ephemeral "
                          r"server$", err, re.M)) == 1, err[-3000:]
    assert local_server.read_state(home) is None and servers_of(home) == []  # the slow one was not left behind


def test_ctrl_c_ends_the_run_and_leaves_the_shared_server_running(tmp_path, home):
    from mockllm import MockLLM

    with MockLLM(latency=30) as slow:  # every answer takes long: the run is surely mid-way when interrupted
        proc = start_run(tmp_path, home, "interrupted", slow.base_url)
        until(lambda: len(slow.requests()) >= 1, "the run to ask the model", timeout=300)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: reaches the run's process group only
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, f"{out[-2000:]}\n{err[-2000:]}"
    assert "interrupted: every finished prompt is saved" in err
    state = recorded(home)
    assert local_server.alive(state) and servers_of(home) == [state.pid]


def test_a_run_interrupted_while_its_server_starts_leaves_no_unrecorded_server(tmp_path, home, mock_llm):
    proc = start_run(tmp_path, home, "cut-short", mock_llm.base_url)
    # Ctrl-C as soon as the server process exists, while the run still waits for it to answer
    until(lambda: servers_of(home), "the run to start a server", timeout=300, every=0.05)
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=120)
    assert servers_of(home) in ([], [recorded(home).pid])  # any server left is one the next run finds

    out, _ = run_ok(tmp_path, home, "next", mock_llm.base_url)
    assert servers_of(home) == [recorded(home).pid] and ui_of(out)[1] == recorded(home).port


def test_an_unknown_server_mode_is_refused(tmp_path, home, mock_llm):
    proc = start_run(tmp_path, home, "bad-mode", mock_llm.base_url, HERMES_PREFECT_SERVER="sometimes")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, f"{out[-2000:]}\n{err[-2000:]}"
    assert "error: HERMES_PREFECT_SERVER='sometimes': expected background or ephemeral" in err
    assert servers_of(home) == []


def test_a_server_of_another_prefect_version_is_replaced(tmp_path, home, mock_llm):
    """After `pip install -U prefect` the recorded server still runs the old code: not reused."""
    run_ok(tmp_path, home, "old", mock_llm.base_url)
    old = recorded(home)
    (home / local_server.STATE_FILE).write_text(old.model_copy(update={"prefect_version": "3.0.0"}).model_dump_json())

    run_ok(tmp_path, home, "upgraded", mock_llm.base_url)
    new = recorded(home)
    assert new.pid != old.pid and new.prefect_version == local_server.installed_prefect()
    assert servers_of(home) == [new.pid]  # the old one was stopped, not left behind
