"""Prompts spread over worker processes of this machine (--worker_processes, hermes/run/local_processes.py),
on both engines. The run's process keeps the
index and outputs; --num_workers stays the whole run's ceiling; containers go, including those a
killed worker process left."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hermes.data import journal
from hermes.run import local_processes
from hermes.sandbox.base import SandboxSettings
from hermes.settings import RunSettings
from hermes.run.status import run_status
from mockllm import MockLLM
from tests.conftest import containers_of
from tests.helpers import read_jsonl, script, tool_responses, unique_run, until, write_dataset

pytest.importorskip("distributed")
ROOT = Path(__file__).resolve().parents[2]


def settings_of(tmp_path: Path, run_name: str, **kw) -> RunSettings:
    return RunSettings(dataset_file=str(tmp_path / "d.jsonl"), batch_size=2, run_name=run_name,
                       output_dir=str(tmp_path / "data"), **kw)


@pytest.mark.parametrize("num_workers, given, expected", [
    (512, None, 1),  # off by default: threads of the run's own process
    (8, 3, 3), (2, 5, 2),  # never more processes than prompts in flight
])
def test_how_many_processes_a_run_gets_and_each_ones_share(tmp_path, num_workers, given, expected):
    s = settings_of(tmp_path, "r", num_workers=num_workers, **({"worker_processes": given} if given else {}))
    assert local_processes.processes_for(s) == expected
    assert local_processes.share(s) * expected <= num_workers  # --num_workers stays the ceiling
    assert local_processes.elsewhere(s) == (expected > 1)
    # a Dask cluster's workers run the prompts then: none of this machine's processes
    assert local_processes.processes_for(s.model_copy(update={"dask_address": "tcp://127.0.0.1:8786"})) == 1


def prompts() -> list[str]:
    free = [f"prompt {i} " + script({"reasoning": f"think {i}", "content": f"answer {i}"}) for i in range(17)]
    boxed = "in a container " + script(
        {"reasoning": "look", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo from-$((6*7))"}}]},
        {"reasoning": "seen", "content": "done"})
    return free + [boxed]


def check_outputs(run_dir: Path, sent: list[str], server_peak: int, num_workers: int) -> None:
    lines = [e for _, p in journal.batch_files(run_dir) for e in journal.read(p)]
    workers = {e["hermes"]["worker"] for e in lines}
    host = socket.gethostname()
    assert len(workers) == 2 and f"{host}:{os.getpid()}" not in workers, workers  # two other processes
    out = read_jsonl(run_dir / "trajectories.jsonl")
    assert sorted(e["conversations"][1]["value"] for e in out) == sorted(sent)  # each prompt once
    boxed = next(e for e in out if e["conversations"][1]["value"].startswith("in a container"))
    assert "from-42" in json.dumps(tool_responses(boxed))  # ran in its Docker sandbox
    assert server_peak <= num_workers  # the whole run's ceiling, shared between the processes
    assert run_status(run_dir)["containers_maybe_left"] == []


def test_a_direct_run_over_two_worker_processes(tmp_path, docker_engine, sandbox_image):
    sent = prompts()
    write_dataset(tmp_path / "d.jsonl", [{"prompt": p} for p in sent])
    name = unique_run("procs-direct")
    with MockLLM(latency=0.2) as server:
        done = subprocess.run(
            [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={tmp_path / 'd.jsonl'}", "--batch_size=2",
             f"--run_name={name}", f"--base_url={server.base_url}", "--model=mock-model", "--num_workers=4",
             "--worker_processes=2", "--distribution=terminal_only", "--sandbox_prefetch=false", "--engine=direct",
             "--verbose", "--max_no_tool_use_share=1"],  # 17 of 18 answer in prose
            cwd=tmp_path, capture_output=True, text=True, timeout=600)
        peak = server.stats()["max_in_flight"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "prompts in 2 worker processes on this machine, 2 in flight in each" in done.stderr
    assert "18/18 prompts (100%)" in done.stderr  # progress, counted from the journal
    # the worker processes' logs, printed as the run's own process prints its own
    started = re.findall(r"^\d\d:\d\d:\d\d\.\d{3} \| INFO    \| hermes\.run\.prompts - prompt (\d+) started", done.stderr, re.M)
    assert sorted(map(int, started)) == list(range(18))
    check_outputs(tmp_path / "data" / name, sent, peak, 4)
    assert not containers_of(docker_engine, name)


@pytest.mark.usefixtures("prefect_harness")
def test_a_prefect_run_over_two_worker_processes(tmp_path, docker_engine, sandbox_image):
    from flows.batch import batch_run

    sent = prompts()
    write_dataset(tmp_path / "d.jsonl", [{"prompt": p} for p in sent])
    name = unique_run("procs-prefect")
    with MockLLM(latency=0.2) as server:
        stats = batch_run(settings=settings_of(tmp_path, name, base_url=server.base_url, model="mock-model",
                                               num_workers=4, worker_processes=2, distribution="terminal_only",
                                               sandbox=SandboxSettings(prefetch=False),
                                               max_no_tool_use_share=1))  # 17 of 18 answer in prose
        peak = server.stats()["max_in_flight"]
    assert stats["trajectories_written"] == 18 and stats["prompts_failed"] == 0
    check_outputs(tmp_path / "data" / name, sent, peak, 4)
    assert not containers_of(docker_engine, name)


def test_a_killed_worker_process_s_container_goes_and_its_prompt_runs_again(tmp_path, docker_engine, sandbox_image):
    """A worker process killed while its prompt's command runs: the batch reruns (Dask), the prompt
    completes, and the dead process's container is gone when the run ends."""
    slow = "slow " + script(
        {"reasoning": "wait", "tool_calls": [{"name": "terminal", "arguments": {"command": "sleep 6; echo slept"}}]},
        {"reasoning": "seen", "content": "done"})
    sent = [slow] + [f"prompt {i} " + script({"reasoning": "r", "content": f"a {i}"}) for i in range(5)]
    write_dataset(tmp_path / "d.jsonl", [{"prompt": p} for p in sent])
    name = unique_run("procs-killed")
    outcome: dict = {}
    with MockLLM(latency=0.05) as server:
        settings = settings_of(tmp_path, name, base_url=server.base_url, model="mock-model", num_workers=4,
                               worker_processes=2, distribution="terminal_only", sandbox=SandboxSettings(prefetch=False))
        from hermes.run import direct

        runner = threading.Thread(target=lambda: outcome.update(stats=direct.run(settings)), daemon=True)
        runner.start()
        try:
            # the slow prompt's container (row 0; the run's own process makes a limit probe too),
            # made by a worker process: kill that process mid-command
            slow_box = lambda: [c for c in containers_of(docker_engine, name)  # noqa: E731
                                if (c.attrs.get("Labels") or {}).get("hermes-batch.prompt") == "0"]
            box = until(slow_box, "the slow prompt's container", timeout=120)[0]
            owner = box.attrs["Labels"]["hermes-batch.owner"]
            assert owner.rpartition(":")[0] == socket.gethostname() and owner != f"{socket.gethostname()}:{os.getpid()}"
            os.kill(int(owner.rpartition(":")[2]), signal.SIGKILL)
        finally:
            runner.join(300)  # never leave the run going into the next tests
        assert not runner.is_alive(), "the run did not finish after its worker process was killed"
    stats = outcome["stats"]
    assert stats["trajectories_written"] == 6 and stats["prompts_failed"] == 0
    out = read_jsonl(tmp_path / "data" / name / "trajectories.jsonl")
    assert sorted(e["conversations"][1]["value"] for e in out) == sorted(sent)
    assert "slept" in json.dumps(tool_responses(next(e for e in out if e["conversations"][1]["value"] == slow)))
    assert not containers_of(docker_engine, name)  # the killed process's container too
    assert run_status(tmp_path / "data" / name)["containers_maybe_left"] == []
