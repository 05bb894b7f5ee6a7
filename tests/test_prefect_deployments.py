"""Prefect-native operation, as a user runs it: a real `prefect server start`, the repo's prefect.yaml
deployed with `prefect deploy --all`, a process worker, runs started with `prefect deployment run`.

Real parts only: the Prefect server, CLI and worker are subprocesses; the model is the bundled
scripted server on loopback (in this process); every prompt runs in a real Docker container.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from hermes.rundir import RunLock
from tests.conftest import containers_of
from tests.prefect_server import PrefectServer, running_prefect_server
from tests.helpers import HeaderRecorder, script, write_dataset, read_jsonl

ROOT = Path(__file__).resolve().parent.parent
POOL = "hermes"  # the work pool named in prefect.yaml
FINAL_WAIT = 420  # seconds before a run that never ends is reported (not a timing assertion)
RUN_NAMES: list[str] = []  # containers of these runs are removed at teardown, whatever happened


@dataclass
class Stack:
    server: PrefectServer
    env: dict[str, str]
    worker_log: Path
    base_url: str
    data: Path
    keys: HeaderRecorder  # the Authorization header of every model call the runs made

    def prefect(self, *args: str, cwd: Path = ROOT, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "prefect", *args], cwd=cwd, env=self.env,
                              capture_output=True, text=True, timeout=300)
        if check:
            assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    @contextlib.contextmanager
    def client(self) -> Iterator[Any]:
        from prefect import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: self.server.api_url}):
            with get_client(sync_client=True) as client:
                yield client

    def settings(self, dataset: Path, run_name: str, **kw) -> dict:
        RUN_NAMES.append(run_name)
        return {"dataset_file": str(dataset), "run_name": run_name, "batch_size": 3, "num_workers": 4,
                "model": "mock-model", "base_url": self.base_url, "output_dir": str(self.data), **kw}

    def run_deployment(self, name: str, *args: str) -> str:
        """`prefect deployment run NAME ARGS...`; returns the new flow run's id."""
        out = self.prefect("deployment", "run", name, *args).stdout
        m = re.search(r"UUID: ([0-9a-f-]{36})", out)
        assert m, out
        return m.group(1)

    def wait_final(self, flow_run_id: str):
        deadline = time.monotonic() + FINAL_WAIT
        with self.client() as client:
            while True:
                run = client.read_flow_run(flow_run_id)
                if run.state and run.state.is_final():
                    return run
                if time.monotonic() > deadline:
                    pytest.fail(f"flow run {flow_run_id} still {run.state.name if run.state else None} "
                                f"after {FINAL_WAIT}s; worker log:\n{self.worker_log.read_text()[-5000:]}")
                time.sleep(1)

    def artifacts(self, flow_run_id: str) -> dict[str, Any]:
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

        with self.client() as client:
            found = client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
        return {a.key.split("-", 1)[0]: a for a in found if a.key}


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc): flow-run processes sit in sessions of their own."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process, its process group and every descendant."""
    family = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    for pid in family:
        _signal(pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in family:
        if _alive(pid):
            _signal(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, sandbox_image, docker_engine) -> Iterator[Stack]:
    """Server, work pool, `prefect deploy --all`, a worker started outside the repo, the model server."""
    from mockllm import MockLLM
    from hermes.sandbox import cleanup

    base = tmp_path_factory.mktemp("prefect-deployments")
    with running_prefect_server(base / "server") as server, MockLLM() as llm, HeaderRecorder(llm.url) as keys:
        env = {**server.env, "PREFECT_WORKER_QUERY_SECONDS": "2", "HERMES_API_KEY": "from-worker-env"}
        st = Stack(server=server, env=env, worker_log=base / "worker.log", base_url=keys.base_url, data=base / "data",
                   keys=keys)
        st.prefect("work-pool", "create", POOL, "--type", "process")
        deployed = st.prefect("--no-prompt", "deploy", "--all")
        for name in ("batch-run/batch-run", "merge-run/merge-run", "batch-run/nightly-eval"):
            assert f"Deployment '{name}' successfully created" in deployed.stdout, deployed.stdout[-3000:]
        (base / "elsewhere").mkdir()
        with open(st.worker_log, "wb") as log:
            worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL],
                                      cwd=base / "elsewhere", env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        try:
            yield st
        finally:
            _stop(worker)
            for run_name in RUN_NAMES:
                cleanup(run_name)


def test_prefect_yaml_deploys_the_three_deployments(stack):
    with stack.client() as client:
        batch = client.read_deployment_by_name("batch-run/batch-run")
        merge = client.read_deployment_by_name("merge-run/merge-run")
        nightly = client.read_deployment_by_name("batch-run/nightly-eval")

    # The form: one validated RunSettings model, every field described.
    schema = batch.parameter_openapi_schema
    assert schema["properties"]["settings"]["$ref"] == "#/definitions/RunSettings"
    fields = schema["definitions"]["RunSettings"]["properties"]
    assert set(schema["definitions"]["RunSettings"]["required"]) == {"dataset_file", "batch_size", "run_name"}
    assert all(f.get("description") for f in fields.values())
    assert fields["max_failed_share"]["default"] == 0.5
    assert "api_key" not in json.dumps(fields).replace("api_key_secret", "")  # the key is never a parameter
    assert schema["properties"]["api_key_secret"]["description"]
    assert batch.parameters["settings"]["dataset_file"] == "deployments/demo/prompts.jsonl"

    # Flow code is found where `prefect deploy` ran, whatever the worker's folder.
    for d in (batch, merge, nightly):
        assert d.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]
        assert d.work_pool_name == POOL
        assert d.job_variables["env"]["PREFECT_LOGGING_EXTRA_LOGGERS"] == "hermes"
        assert d.global_concurrency_limit.limit == 1
    assert batch.concurrency_options.collision_strategy.value == "ENQUEUE"
    assert nightly.concurrency_options.collision_strategy.value == "CANCEL_NEW"

    # The cron job, moved here: 02:00 Berlin time, shipped inactive.
    assert batch.schedules == [] and merge.schedules == []
    [sched] = nightly.schedules
    assert sched.schedule.cron == "0 2 * * *" and sched.schedule.timezone == "Europe/Berlin"
    assert sched.active is False
    assert nightly.parameters["stamp_run_name"] is True


def test_batch_run_deployment_through_a_worker(stack, tmp_path, docker_engine):
    prompts = [f"Deployment prompt {i}: note a token and report the hostname." for i in range(7)]
    dataset = write_dataset(tmp_path / "prompts.jsonl", [{"prompt": p, "source": "deploy"} for p in prompts])
    subprocess.run([sys.executable, "-c", "from prefect.blocks.system import Secret; "
                    "Secret(value='sk-from-secret-block').save('hermes-test-key', overwrite=True)"],
                   env=stack.env, check=True, timeout=120)
    settings = stack.settings(dataset, "deployed")
    stack.keys.authorizations.clear()
    run_id = stack.run_deployment("batch-run/batch-run", "--params",
                                  json.dumps({"settings": settings, "api_key_secret": "hermes-test-key"}))
    run = stack.wait_final(run_id)
    assert run.state.type.value == "COMPLETED", f"{run.state.message}\n{stack.worker_log.read_text()[-5000:]}"
    assert run.name == "batch-deployed"
    # The Secret block's key reached the model on every call, over the worker's HERMES_API_KEY;
    # Prefect keeps the block's name, never the key, in the run's parameters.
    assert stack.keys.authorizations and set(stack.keys.authorizations) == {"Bearer sk-from-secret-block"}
    with stack.client() as client:
        stored = json.dumps(client.read_flow_run(run_id).parameters)
    assert "hermes-test-key" in stored and "sk-from-secret-block" not in stored

    out = stack.data / "deployed"
    entries = read_jsonl(out / "trajectories.jsonl")
    assert sorted(e["conversations"][1]["value"] for e in entries) == sorted(prompts)  # every prompt once
    stats = json.loads((out / "statistics.json").read_text())
    assert stats["total_prompts"] == 7 and stats["trajectories_written"] == 7 and stats["prompts_failed"] == 0
    assert stats["total_batches"] == 3
    assert containers_of(docker_engine, "deployed") == []

    arts = stack.artifacts(run_id)
    assert {"progress", "statistics", "tools", "summary"} <= set(arts) and "failed" not in arts
    assert arts["progress"].type == "progress" and float(arts["progress"].data) == 100.0
    table = {r["statistic"]: r["value"] for r in json.loads(arts["statistics"].data)}
    assert table["trajectories_written"] == 7 and table["prompts_failed"] == 0 and table["failed_share"] == 0
    tools = {r["tool"]: r for r in json.loads(arts["tools"].data)}
    assert tools["read_file"]["count"] == 7
    summary = arts["summary"].data
    assert arts["summary"].type == "markdown"
    assert str(out / "trajectories.jsonl") in summary and str(out / "statistics.json") in summary
    assert "**Done**: 7 trajectories from 7 prompts" in summary

    # The merge deployment rebuilds the outputs from the batch files.
    merge_id = stack.run_deployment("merge-run/merge-run", "-p", "run_name=deployed", "-p", f"output_dir={stack.data}")
    merged = stack.wait_final(merge_id)
    assert merged.state.type.value == "COMPLETED", merged.state.message
    assert merged.name == "merge-deployed"
    assert len(read_jsonl(out / "trajectories.jsonl")) == 7
    assert "summary" in stack.artifacts(merge_id)


def test_run_fails_clearly_when_too_many_prompts_fail(stack, tmp_path, docker_engine):
    rows = [{"prompt": "this one works"}] + [
        {"prompt": f"broken {i} " + script({"error": 400})} for i in range(3)]
    settings = stack.settings(write_dataset(tmp_path / "bad.jsonl", rows), "too-many-failed", max_failed_share=0.5)
    stack.keys.authorizations.clear()
    run_id = stack.run_deployment("batch-run/batch-run", "--params", json.dumps({"settings": settings}))
    run = stack.wait_final(run_id)
    assert run.state.type.value == "FAILED"
    # No Secret block named: the key is the worker's environment's (HERMES_API_KEY).
    assert stack.keys.authorizations and set(stack.keys.authorizations) == {"Bearer from-worker-env"}
    message = run.state.message
    assert "TooManyFailedPrompts: 3 of 4 prompts failed (75%)" in message
    assert "max_failed_share=0.5" in message and "resume=true" in message

    out = stack.data / "too-many-failed"  # the outputs are written all the same
    assert [e["conversations"][1]["value"] for e in read_jsonl(out / "trajectories.jsonl")] == ["this one works"]
    assert json.loads((out / "statistics.json").read_text())["prompts_failed"] == 3
    assert containers_of(docker_engine, "too-many-failed") == []

    arts = stack.artifacts(run_id)
    failed = json.loads(arts["failed"].data)
    assert sorted(r["prompt_index"] for r in failed) == [1, 2, 3]
    assert all("400" in r["reason"] for r in failed) and all(r["prompt"].startswith("broken") for r in failed)
    assert "**Failed**: 3 of 4 prompts failed" in arts["summary"].data
    assert float(arts["progress"].data) == 100.0

    # "Retry" in the UI (the same state change the UI makes): the run resumes its own folder and
    # runs the failed prompts again, instead of being refused for having results.
    from prefect.states import State, StateType

    with stack.client() as client:
        client.set_flow_run_state(run_id, State(type=StateType.SCHEDULED, name="AwaitingRetry",
                                                message="Retry from the UI"), force=False)
    retried = stack.wait_final(run_id)
    assert retried.run_count == 2
    assert retried.state.type.value == "FAILED" and "TooManyFailedPrompts: 3 of 4" in retried.state.message
    journal = [e for p in sorted(out.glob("batch_*.jsonl")) for e in read_jsonl(p)]
    assert len(journal) == 4 + 3  # the three failed prompts ran again, the completed one did not
    assert len(read_jsonl(out / "trajectories.jsonl")) == 1


def test_same_run_twice_at_once_is_refused(stack, tmp_path, docker_engine):
    settings = stack.settings(write_dataset(tmp_path / "p.jsonl", [{"prompt": "hello"}]), "busy")
    lock = RunLock(stack.data / "busy")  # another invocation of run 'busy' holds its folder
    lock.acquire()
    try:
        run = stack.wait_final(stack.run_deployment("batch-run/batch-run", "--params", json.dumps({"settings": settings})))
    finally:
        lock.release()
    assert run.state.type.value == "FAILED"
    assert "RunRefused" in run.state.message and "is in use by pid" in run.state.message
    assert "cannot run at once" in run.state.message
    assert not list((stack.data / "busy").glob("batch_*.jsonl"))


def test_scheduled_deployment_gets_a_folder_per_run(stack, tmp_path, docker_engine):
    """The nightly deployment, started by hand: -p replaces `settings` whole; stamp_run_name stays on."""
    settings = stack.settings(write_dataset(tmp_path / "eval.jsonl", [{"prompt": f"eval {i}"} for i in range(2)]),
                              "nightly-t")
    run = stack.wait_final(stack.run_deployment("batch-run/nightly-eval", "-p", f"settings={json.dumps(settings)}"))
    assert run.state.type.value == "COMPLETED", run.state.message
    [folder] = [p for p in stack.data.glob("nightly-t-*") if p.is_dir()]
    assert re.fullmatch(r"nightly-t-\d{4}-\d\d-\d\dT\d{4}Z", folder.name)
    assert run.name == f"batch-{folder.name}"
    assert len(read_jsonl(folder / "trajectories.jsonl")) == 2
    RUN_NAMES.append(folder.name)
    assert containers_of(docker_engine, folder.name) == []
