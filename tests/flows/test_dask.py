"""One run across a real Dask cluster (distributed.LocalCluster, worker processes) through
Prefect's own Dask task runner: batches spread over the workers, a killed worker's batch reruns
elsewhere without running its finished prompts again, and what a dead worker may have left is
in the run's status."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from hermes.data import journal
from hermes.run import remote, workerfiles
from hermes.data.dataset import load_rows
from hermes.data.run_paths import RunPaths
from hermes.sandbox.base import SandboxSettings
from hermes.settings import RunSettings
from hermes.run.status import format_status, run_status
from mockllm import MockLLM
from tests.conftest import containers_of
from tests.helpers import unique_run, read_jsonl, script, tool_responses, write_dataset

SPREAD = unique_run("spread")  # its containers' label: unique on a shared engine
KILLED = unique_run("killed")  # its containers' label: unique on a shared engine

distributed = pytest.importorskip("distributed")


@pytest.fixture
def cluster():
    """Two worker processes (each restarted by its nanny if killed), one thread each at most two."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
                                  worker_dashboard_address=None) as c:
        yield c


def worker_pids(address: str) -> dict[str, int]:
    """Dask worker address -> the pid of its process, asked of the workers through the scheduler."""
    with distributed.Client(address, timeout=30) as client:
        return client.run(os.getpid)


def tool_free(i: int) -> str:
    """A prompt answered in one model call, offered tools it does not call (so no container)."""
    return f"prompt {i} " + script({"reasoning": f"think {i}", "content": f"answer {i}"})


def requests_by_prompt(server: MockLLM) -> Counter:
    """Model calls per prompt (by the conversation's first user message), from the server's log."""
    # A request cut off by its killed sender arrives without a body (recorded as None): not a call.
    return Counter(next(m["content"] for m in body["messages"] if m["role"] == "user")
                   for body in server.requests() if isinstance(body, dict))


def journal_lines(run_dir: Path) -> list[dict]:
    return [e for _, p in journal.batch_files(run_dir) for e in journal.read(p)]


def settings_for(tmp_path: Path, dataset: Path, run_name: str, server: MockLLM, address: str, **kw) -> RunSettings:
    return RunSettings(dataset_file=str(dataset), run_name=run_name, output_dir=str(tmp_path / "data"),
                       base_url=server.base_url, model="mock-model", dask_address=address,
                       **{"batch_size": 3, "num_workers": 2,
                          "max_no_tool_use_share": 1, **kw})  # prose answers: questions that merely offer tools


@pytest.mark.usefixtures("prefect_harness")
def test_a_run_spreads_over_the_workers_and_holds_each_prompt_once(tmp_path, cluster, docker_engine, sandbox_image,
                                                                  capfd):
    from flows.batch import batch_run

    prompts = [tool_free(i) for i in range(29)]
    prompts.append("in a container " + script(
        {"reasoning": "look", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo from-$((6*7))"}}]},
        {"reasoning": "seen", "content": "done"}))
    dataset = write_dataset(tmp_path / "d.jsonl", [{"prompt": p} for p in prompts])
    with MockLLM(latency=0.15) as server:
        # terminal_only: every worker opens its machine's Docker backend; prefetch off, so only the
        # prompt that calls the terminal makes a container.
        settings = settings_for(tmp_path, dataset, SPREAD, server, cluster.scheduler_address,
                                distribution="terminal_only", sandbox=SandboxSettings(prefetch=False))
        stats = batch_run(settings=settings)
        in_flight_peak = server.stats()["max_in_flight"]

    run_dir = tmp_path / "data" / SPREAD
    lines = journal_lines(run_dir)
    workers = {e["hermes"]["worker"] for e in lines}
    assert len(workers) >= 2, f"every prompt ran in one process: {workers}"
    assert workers <= {f"{socket.gethostname()}:{pid}" for pid in worker_pids(cluster.scheduler_address).values()}
    assert stats["trajectories_written"] == 30 and stats["prompts_failed"] == 0
    out = read_jsonl(run_dir / "trajectories.jsonl")
    assert sorted(e["conversations"][1]["value"] for e in out) == sorted(prompts)
    boxed = next(e for e in out if e["conversations"][1]["value"].startswith("in a container"))
    assert "from-42" in json.dumps(tool_responses(boxed))
    # --num_workers is per Dask worker process: 2 workers x 2 prompts, though each worker runs 2 batches at once.
    assert in_flight_peak <= 2 * 2
    assert not containers_of(docker_engine, SPREAD)
    assert run_status(run_dir)["containers_maybe_left"] == []
    # Progress, counted from the journal as the workers write it: the terminal line and the UI's artifact.
    assert "30/30 prompts (100%)" in capfd.readouterr().err
    assert progress_artifact(SPREAD) == 100.0


def progress_artifact(run_name: str) -> float:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from tasks.report import artifact_key

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["progress-" + artifact_key(run_name)])))
    return float(found[0].data)


@pytest.mark.usefixtures("prefect_harness")
def test_a_killed_worker_s_batch_reruns_elsewhere_without_its_finished_prompts(tmp_path, cluster):
    from flows.batch import batch_run

    prompts = [tool_free(i) for i in range(36)]
    dataset = write_dataset(tmp_path / "d.jsonl", [{"prompt": p} for p in prompts])
    run_dir = tmp_path / "data" / KILLED
    address = cluster.scheduler_address
    pids = set(worker_pids(address).values())
    outcome: dict = {}

    with MockLLM(latency=0.25) as server:
        # No containers here (the local backend): the fault is the point.
        settings = settings_for(tmp_path, dataset, KILLED, server, address, distribution="terminal_only",
                                sandbox=SandboxSettings(backend="local"), batch_size=6)
        runner = threading.Thread(target=lambda: outcome.update(stats=batch_run(settings=settings)), daemon=True)
        runner.start()
        killed = None
        deadline = time.monotonic() + 240
        while killed is None:  # a batch part done by a worker of the cluster: kill that worker
            assert runner.is_alive(), "the run ended before a worker could be killed mid-batch"
            assert time.monotonic() < deadline, "no batch was ever seen part done"
            for _, path in journal.batch_files(run_dir):
                done = list(journal.read(path))
                pid = int(done[0]["hermes"]["worker"].rpartition(":")[2]) if done else None
                if 1 <= len(done) < 6 and pid in pids:
                    os.kill(pid, signal.SIGKILL)
                    killed = (path, pid)
                    break
            time.sleep(0.02)
        finished_before = {e["conversations"][1]["value"] for e in journal_lines(run_dir)}
        runner.join(240)
        assert not runner.is_alive(), "the run did not finish after the kill"
        calls = requests_by_prompt(server)

    assert outcome["stats"]["trajectories_written"] == 36 and outcome["stats"]["prompts_failed"] == 0
    out = read_jsonl(run_dir / "trajectories.jsonl")
    assert sorted(e["conversations"][1]["value"] for e in out) == sorted(prompts)  # each exactly once
    # Prompts finished before the kill were never asked of the model again (one call each)...
    assert finished_before and {p: calls[p] for p in finished_before} == {p: 1 for p in finished_before}
    # ...and only those the killed worker was running (at most num_workers) ran twice.
    assert sum(1 for p in prompts if calls[p] > 1) <= 2
    # The killed batch was finished by another process, each of its prompts once.
    path, pid = killed
    batch = list(journal.read(path))
    assert len({e["hermes"]["key"] for e in batch}) == len(batch) == 6
    assert {e["hermes"]["worker"] for e in batch} - {f"{socket.gethostname()}:{pid}"}


def test_a_rerun_batch_skips_journalled_prompts_and_seals_a_torn_line(tmp_path):
    rows_file = write_dataset(tmp_path / "d.jsonl", [{"prompt": tool_free(i)} for i in range(4)])
    rows, _ = load_rows(rows_file)
    run_dir = tmp_path / "data" / "torn"
    run_dir.mkdir(parents=True)
    batch = run_dir / "batch_0.jsonl"
    # A dead worker finished row 0, then was killed while writing row 1's line.
    batch.write_bytes(journal.encode({"prompt_index": 0, "hermes": {"key": rows[0].key, "status": "completed"}})
                      + b'{"prompt_index": 1, "conversations": [{"from": "sys')
    with MockLLM() as server:
        settings = RunSettings(dataset_file=str(rows_file), run_name="torn", output_dir=str(tmp_path / "data"),
                               base_url=server.base_url, model="m", batch_size=4, distribution="terminal_only",
                               sandbox=SandboxSettings(backend="local"))
        counts = remote.run_batch(0, rows, remote.RunOrder(settings=settings, run_dir=str(run_dir)))
        calls = requests_by_prompt(server)
    assert counts["completed"] == 3
    assert rows[0].row.prompt not in calls  # finished before: no model call
    keys = [e["hermes"]["key"] for e in journal.read(batch)]
    assert sorted(keys) == sorted(r.key for r in rows)  # none lost to the torn fragment, none twice


def test_status_names_the_host_a_dead_worker_may_have_left_containers_on(tmp_path):
    run_dir = tmp_path / "data" / "left"
    RunPaths(run_dir).workers.mkdir(parents=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    # dead with 2 in flight; alive with none; dead, but its run made no containers
    for name, pid, n, sandboxed in (("a", gone.pid, 2, True), ("b", os.getpid(), 0, True), ("c", gone.pid, 3, False)):
        (RunPaths(run_dir).workers / f"{name}.json").write_text(json.dumps(
            {"worker": f"{host}:{pid}", "host": host, "pid": pid, "in_flight": n, "sandboxed": sandboxed}))
    s = run_status(run_dir)
    assert [(w["host"], w["pid"], w["in_flight"], w["alive"]) for w in s["containers_maybe_left"]] == \
        [(host, gone.pid, 2, False)]
    assert f"containers may be left: 2 on host {host}" in format_status(s)
    workerfiles.forget_dead_workers(run_dir)  # what that host's next start of the run does after its clean-up
    assert run_status(run_dir)["containers_maybe_left"] == []


def owner_of(container) -> str:
    return (container.attrs.get("Labels") or {}).get("hermes-batch.owner", "")  # a listed (sparse) container's


def sleeping_containers_of(client, run_name: str, owners: set[str]) -> list:
    """The run's containers owned by one of `owners` (host:pid) that are inside their `sleep` tool call."""
    found = []
    for c in containers_of(client, run_name):
        try:
            if owner_of(c) in owners and any(
                    "sleep 8" in " ".join(p) for p in client.api.top(c.id)["Processes"]):
                found.append(c)
        except Exception:  # noqa: BLE001 - a container still starting, or just removed
            continue
    return found


@pytest.mark.usefixtures("prefect_harness")
def test_a_worker_killed_with_its_containers_up_leaves_none_after_the_run(tmp_path, cluster, docker_engine,
                                                                          sandbox_image):
    """Issue 34: a worker SIGKILLed while its batch's containers are up cannot remove them; the
    live workers do (their batches' sweeps, and every worker's end_of_run at the run's end)."""
    from flows.batch import batch_run

    prompts = [f"slow {i} " + script(
        {"reasoning": "wait", "tool_calls": [{"name": "terminal", "arguments": {"command": "sleep 8; echo slept"}}]},
        {"reasoning": "waited", "content": f"done {i}"}) for i in range(8)]
    dataset = write_dataset(tmp_path / "d.jsonl", [{"prompt": p} for p in prompts])
    run_name = f"dask-killed-{os.getpid()}"
    address = cluster.scheduler_address
    owners = {f"{socket.gethostname()}:{pid}" for pid in worker_pids(address).values()}
    outcome: dict = {}
    with MockLLM() as server:
        settings = settings_for(tmp_path, dataset, run_name, server, address, distribution="terminal_only",
                                batch_size=2, sandbox=SandboxSettings(prefetch=False))
        runner = threading.Thread(target=lambda: outcome.update(stats=batch_run(settings=settings)), daemon=True)
        runner.start()
        deadline = time.monotonic() + 240
        while not (up := sleeping_containers_of(docker_engine, run_name, owners)):
            assert runner.is_alive() and time.monotonic() < deadline, "no worker's container was seen in its tool call"
            time.sleep(0.1)
        victim = owner_of(up[0])
        left = {c.id for c in containers_of(docker_engine, run_name) if owner_of(c) == victim}
        os.kill(int(victim.rpartition(":")[2]), signal.SIGKILL)
        runner.join(300)
        assert not runner.is_alive(), "the run did not finish after the kill"

    assert outcome["stats"]["trajectories_written"] == 8 and outcome["stats"]["prompts_failed"] == 0
    out = read_jsonl(tmp_path / "data" / run_name / "trajectories.jsonl")
    assert sorted(e["conversations"][1]["value"] for e in out) == sorted(prompts)  # each exactly once
    assert left  # the killed worker had containers up when it died...
    assert containers_of(docker_engine, run_name) == []  # ...and no container of the run is left on the engine
