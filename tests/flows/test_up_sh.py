"""README's Prefect snippet, typed as it reads: `bash deployments/prefect/up.sh` in one shell, then
in a second shell `export PREFECT_API_URL=...` and `prefect deployment run 'batch-run/batch-run' --watch`.

In a copy of the repository (the deployment's default run writes data/demo/ beside the code it
runs), with a PREFECT_HOME of its own and the server on a free port instead of 4200, so a
developer's own server there is never touched. The demo model server takes port 8808, as the
deployment's default parameters say.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from hermes.settings import API_KEY_ENV_VARS
from tests.helpers import read_jsonl, until
from tests.prefect_server import migrated_database

pytestmark = [pytest.mark.prefect, pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]
MOCK_PORT = 8808  # the batch-run deployment's default base_url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def copy_of_the_repo(dest: Path) -> Path:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file() and not name.startswith("tests/node/"):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def test_up_sh_then_deployment_run_watch_in_a_second_shell(tmp_path, docker_engine):
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", MOCK_PORT)) == 0:
            pytest.fail(f"port {MOCK_PORT} is taken: the deployment's default model server needs it")
    repo = copy_of_the_repo(tmp_path / "repo")
    home = tmp_path / "prefect-home"
    home.mkdir()
    shutil.copyfile(migrated_database(), home / "prefect.db")
    api = f"http://127.0.0.1:{free_port()}/api"
    shell = {**{k: v for k, v in os.environ.items()
                if k not in {*API_KEY_ENV_VARS, "PREFECT_API_URL", "HERMES_ENGINE"}}, "PREFECT_HOME": str(home)}
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        up = subprocess.Popen(["bash", "deployments/prefect/up.sh"], cwd=repo, env={**shell, "PREFECT_API_URL": api},
                              stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        until(lambda: "== ready" in log.read_text(errors="replace") or up.poll() is not None,
              "up.sh to be ready", timeout=420)
        assert up.poll() is None, log.read_text(errors="replace")[-4000:]
        text = log.read_text(errors="replace")
        assert f"other shell: export PREFECT_API_URL={api}" in text  # what the script tells the user to type
        assert httpx.get(api.removesuffix("/api") + "/ui-settings").json()["api_url"] == api

        second = subprocess.run(
            ["bash", "-c", f"export PREFECT_API_URL={api}\nprefect deployment run 'batch-run/batch-run' --watch"],
            cwd=tmp_path, env=shell, capture_output=True, text=True, timeout=600)
        assert second.returncode == 0, f"{second.stdout[-3000:]}\n{second.stderr[-3000:]}\n{text[-3000:]}"
        assert "Completed" in second.stdout + second.stderr
        entries = read_jsonl(repo / "data" / "demo" / "trajectories.jsonl")
        assert len(entries) == len(read_jsonl(repo / "deployments" / "demo" / "prompts.jsonl"))

        runs = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"name": {"any_": ["batch-demo"]}}}).json()
        assert len(runs) == 1 and runs[0]["state"]["type"] == "COMPLETED"
        def batches() -> list[str]:  # the server records task runs from their events, in the background
            tasks = httpx.post(f"{api}/task_runs/filter",
                               json={"task_runs": {"flow_run_id": {"any_": [runs[0]["id"]]}}}).json()
            return sorted(t["name"] for t in tasks if t["name"].startswith("batch-"))

        with contextlib.suppress(AssertionError):
            until(lambda: len(batches()) >= 3, "the batches' task runs to be recorded", 60)
        assert batches() == ["batch-0", "batch-1", "batch-2"]
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)  # Ctrl-C: the script stops the worker and what it started
            try:
                up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", MOCK_PORT)) != 0:
                    break
            time.sleep(0.5)
