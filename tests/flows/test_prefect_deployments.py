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

from hermes.data import journal
from hermes.run.rundir import RunLock
from tests.conftest import containers_of
from tests.prefect_server import PrefectServer, running_prefect_server
from tests.helpers import HeaderRecorder, script, unique_run, until, write_dataset, read_jsonl

ROOT = Path(__file__).resolve().parents[2]
# Run names, unique to this session: they label the runs' containers on an engine other tests (and
# other checkouts' suites) share, and name the flow runs and folders the assertions look for.
KILLED = unique_run("killed")
DEPLOYED, ON_DASK, TOO_MANY_FAILED = unique_run("deployed"), unique_run("deployed-dask"), unique_run("too-many-failed")
BUSY, NIGHTLY, TYPOS, NO_DATASET = unique_run("busy"), unique_run("nightly-t"), unique_run("typos"), unique_run("no-dataset")
EVERY, SERVER_GONE = unique_run("every"), unique_run("server-gone")
ON_SLURM = unique_run("deployed-slurm")
POOL = "hermes"  # the work pool named in prefect.yaml
FINAL_WAIT = 420  # seconds before a run that never ends is reported (not a timing assertion)
CRASH_WAIT = 240  # seconds for the automation to mark a silent run Crashed (it should take 45-60 here)
RUN_NAMES: list[str] = []  # containers of these runs are removed at teardown, whatever happened


@dataclass
class Stack:
    server: PrefectServer
    env: dict[str, str]
    worker_log: Path
    base_url: str
    data: Path
    keys: HeaderRecorder  # the Authorization header of every model call the runs made
    worker: subprocess.Popen | None = None

    def start_worker(self) -> subprocess.Popen:
        """`prefect worker start` from a folder outside the repo, its output appended to worker_log."""
        (self.data.parent / "elsewhere").mkdir(exist_ok=True)
        with open(self.worker_log, "ab") as log:
            self.worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL],
                                           cwd=self.data.parent / "elsewhere", env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        return self.worker

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

    def wait_final(self, flow_run_id: str, timeout: float = FINAL_WAIT):
        deadline = time.monotonic() + timeout
        with self.client() as client:
            while True:
                run = client.read_flow_run(flow_run_id)
                if run.state and run.state.is_final():
                    return run
                if time.monotonic() > deadline:
                    pytest.fail(f"flow run {flow_run_id} still {run.state.name if run.state else None} "
                                f"after {timeout}s; worker log:\n{self.worker_log.read_text()[-5000:]}")
                time.sleep(0.5)

    def artifacts(self, flow_run_id: str) -> dict[str, Any]:
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

        with self.client() as client:
            found = client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
        return {a.key.split("-", 1)[0]: a for a in found if a.key}


def _batch_task_runs(client, flow_run_id: str) -> list:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    found = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return [t for t in found if t.name.startswith("batch-")]


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


def _stop(proc: subprocess.Popen, grace: float = 30) -> None:
    """Stop a process, its process group and every descendant (SIGKILL after `grace` seconds)."""
    family = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    for pid in family:
        _signal(pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in family:
        if _alive(pid):
            _signal(pid, signal.SIGKILL)


SHIPPED_AUTOMATIONS = ROOT / "deployments/prefect/automations.yaml"
# The shipped window is 90 s after the last heartbeat; the test stack's copy waits QUICK_WINDOW.
# Heartbeats cannot come faster than every 30 s (Prefect's minimum, PREFECT_FLOWS_HEARTBEAT_FREQUENCY
# is validated >= 30), so the window must stay above 30 s plus slack for a loaded machine, or a
# live run of this module would be marked Crashed between two heartbeats.
QUICK_WINDOW = 45


def _quick_automations(dest: Path) -> Path:
    """The shipped automations file with only the crash automation's `within` shortened."""
    import yaml

    doc = yaml.safe_load(SHIPPED_AUTOMATIONS.read_text())
    [crash] = [a for a in doc["automations"] if a["name"] == "hermes-batch-crash-silent-runs"]
    crash["trigger"]["within"] = QUICK_WINDOW
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


def test_the_shipped_automation_waits_90_s_for_heartbeats_sent_every_30_s():
    """What the docs say; the module's stack runs the same automation with a shorter window."""
    import yaml

    [crash] = yaml.safe_load(SHIPPED_AUTOMATIONS.read_text())["automations"]
    assert crash["name"] == "hermes-batch-crash-silent-runs" and crash["enabled"] is True
    assert crash["trigger"]["within"] == 90 and crash["trigger"]["posture"] == "Proactive"
    assert crash["actions"] == [{"type": "change-flow-run-state", "state": "CRASHED",
                                 "message": crash["actions"][0]["message"]}]
    assert "No heartbeat for 90 s" in crash["actions"][0]["message"]
    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    for d in deployments:
        assert d["work_pool"]["job_variables"]["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30", d["name"]
        assert "hermes-batch" in d["tags"], d["name"]  # the automation matches runs by this tag
    guide = " ".join((ROOT / "deployments/prefect/README.md").read_text().split())
    assert "a heartbeat every 30 s" in guide and "**Crashed** 90 s after the last one" in guide


@contextlib.contextmanager
def deployed_stack(base: Path) -> Iterator[Stack]:
    """Server, work pool, `prefect deploy --all`, a worker started outside the repo, the model server."""
    from mockllm import MockLLM
    from hermes.sandbox import cleanup

    # The scheduler looks for due schedules every second instead of every 60 s; a run that waits
    # for its deployment's concurrency slot (ENQUEUE) asks again after 2 s instead of 30 s.
    quick = {"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1",
             "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": "2"}
    with running_prefect_server(base / "server", extra_env=quick) as server, MockLLM() as llm, \
            HeaderRecorder(llm.url) as keys:
        # The worker asks for due runs every second (instead of every 10 s).
        env = {**server.env, "PREFECT_WORKER_QUERY_SECONDS": "1", "HERMES_API_KEY": "from-worker-env"}
        st = Stack(server=server, env=env, worker_log=base / "worker.log", base_url=keys.base_url, data=base / "data",
                   keys=keys)
        st.prefect("work-pool", "create", POOL, "--type", "process")
        deployed = st.prefect("--no-prompt", "deploy", "--all")
        for name in ("batch-run/batch-run", "merge-run/merge-run", "batch-run/nightly-eval", "batch-run/dask"):
            assert f"Deployment '{name}' successfully created" in deployed.stdout, deployed.stdout[-3000:]
        created = st.prefect("automation", "create", "--from-file", str(_quick_automations(base / "automations.yaml")))
        assert "hermes-batch-crash-silent-runs" in created.stdout, created.stdout
        st.start_worker()
        try:
            yield st
        finally:
            # A worker whose server is gone (test_a_run_finishes_... stops it) spends ~15 s in vain
            # trying to tell it that it is leaving; its flow runs have ended, so it is not waited for.
            _stop(st.worker, grace=30 if st.server.proc.poll() is None else 2)
            for run_name in RUN_NAMES:
                cleanup(run_name)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, sandbox_image, docker_engine) -> Iterator[Stack]:
    """The stack the module's tests share."""
    with deployed_stack(tmp_path_factory.mktemp("prefect-deployments")) as st:
        yield st


@pytest.fixture
def own_stack(tmp_path_factory, sandbox_image, docker_engine) -> Iterator[Stack]:
    """A stack of the test's own, for a test that stops its server: the others keep theirs, in any order."""
    with deployed_stack(tmp_path_factory.mktemp("prefect-deployments-own")) as st:
        yield st


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
    assert fields["publish"]["default"] is None and "environment" in fields["publish"]["description"]  # issue 48
    assert "api_key" not in json.dumps(fields).replace("api_key_secret", "")  # the key is never a parameter
    assert schema["properties"]["api_key_secret"]["description"]
    assert batch.parameters["settings"]["dataset_file"] == "deployments/demo/prompts.jsonl"
    # Typos are refused by the schema itself; the distribution is a dropdown of the registry's names.
    from hermes.data.distributions import DISTRIBUTIONS

    assert schema["definitions"]["RunSettings"]["additionalProperties"] is False
    assert schema["definitions"]["SandboxSettings"]["additionalProperties"] is False
    assert fields["distribution"]["enum"] == list(DISTRIBUTIONS) and fields["distribution"]["default"] == "default"

    # Flow code is found where `prefect deploy` ran, whatever the worker's folder.
    for d in (batch, merge, nightly):
        assert d.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]
        assert d.work_pool_name == POOL
        assert d.job_variables["env"]["PREFECT_LOGGING_EXTRA_LOGGERS"] == "hermes"
        assert d.job_variables["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30"  # for the zombie-run automation
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
    settings = stack.settings(dataset, DEPLOYED)
    stack.keys.authorizations.clear()
    run_id = stack.run_deployment("batch-run/batch-run", "--params",
                                  json.dumps({"settings": settings, "api_key_secret": "hermes-test-key"}))
    run = stack.wait_final(run_id)
    assert run.state.type.value == "COMPLETED", f"{run.state.message}\n{stack.worker_log.read_text()[-5000:]}"
    assert run.name == f"batch-{DEPLOYED}"
    # The Secret block's key reached the model on every call, over the worker's HERMES_API_KEY;
    # Prefect keeps the block's name, never the key, in the run's parameters.
    assert stack.keys.authorizations and set(stack.keys.authorizations) == {"Bearer sk-from-secret-block"}
    with stack.client() as client:
        stored = json.dumps(client.read_flow_run(run_id).parameters)
    assert "hermes-test-key" in stored and "sk-from-secret-block" not in stored

    out = stack.data / DEPLOYED
    entries = read_jsonl(out / "trajectories.jsonl")
    assert sorted(e["conversations"][1]["value"] for e in entries) == sorted(prompts)  # every prompt once
    stats = json.loads((out / "statistics.json").read_text())
    assert stats["total_prompts"] == 7 and stats["trajectories_written"] == 7 and stats["prompts_failed"] == 0
    assert stats["total_batches"] == 3
    assert containers_of(docker_engine, DEPLOYED) == []

    # The graph the UI draws: plan, a task run per batch (7 prompts, batch size 3), merge, report.
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    def task_names():
        with stack.client() as client:
            found = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
        # Tasks without a run name of their own are named "<task>-<3 hex digits>".
        return sorted(re.sub(r"^(plan-run|merge-run|publish-report)-[0-9a-f]{3}$", r"\1", t.name)
                      for t in found if t.state and t.state.is_completed())
    graph = ["batch-0", "batch-1", "batch-2", "merge-run", "plan-run", "publish-report"]
    with contextlib.suppress(AssertionError):
        until(lambda: task_names() == graph, "the run's task runs recorded", timeout=60)
    assert task_names() == graph

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
    assert f"Run {DEPLOYED}: 7 of 7 prompts done" in summary  # the terminal's summary (hermes.run.summary)
    assert f"`hermes-batch view {DEPLOYED} --output_dir {stack.data}`" in summary

    # The merge deployment rebuilds the outputs from the batch files.
    merge_id = stack.run_deployment("merge-run/merge-run", "-p", f"run_name={DEPLOYED}", "-p", f"output_dir={stack.data}")
    merged = stack.wait_final(merge_id)
    assert merged.state.type.value == "COMPLETED", merged.state.message
    assert merged.name == f"merge-{DEPLOYED}"
    assert len(read_jsonl(out / "trajectories.jsonl")) == 7
    assert "summary" in stack.artifacts(merge_id)


def test_the_dask_deployment_runs_the_batches_on_the_cluster_its_job_variable_names(stack, tmp_path):
    import distributed

    with stack.client() as client:
        dask = client.read_deployment_by_name("batch-run/dask")
    assert dask.job_variables["env"]["HERMES_DASK_ADDRESS"].startswith("tcp://")
    prompts = [f"on dask {i} " + script({"reasoning": "r", "content": f"a {i}"}) for i in range(6)]
    settings = stack.settings(write_dataset(tmp_path / "dask.jsonl", [{"prompt": p} for p in prompts]), ON_DASK,
                              distribution="terminal_only", sandbox={"backend": "local"},
                              max_no_tool_use_share=1)  # prose answers: questions that merely offer tools
    # The workers read the model key from their own environment: it never crosses from the flow.
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  worker_dashboard_address=None, env={"HERMES_API_KEY": "from-dask-worker"}) as cluster:
        stack.keys.authorizations.clear()
        env = {"PREFECT_LOGGING_EXTRA_LOGGERS": "hermes", "HERMES_DASK_ADDRESS": cluster.scheduler_address}
        run = stack.wait_final(stack.run_deployment("batch-run/dask", "--params", json.dumps({"settings": settings}),
                                                    "--job-variable", f"env={json.dumps(env)}"))
        with distributed.Client(cluster.scheduler_address) as dask_client:
            pids = set(dask_client.run(os.getpid).values())
    assert run.state.type.value == "COMPLETED", run.state.message
    out = stack.data / ON_DASK
    assert sorted(e["conversations"][1]["value"] for e in read_jsonl(out / "trajectories.jsonl")) == sorted(prompts)
    ran_in = {int(e["hermes"]["worker"].rpartition(":")[2]) for _, p in journal.batch_files(out) for e in journal.read(p)}
    assert ran_in <= pids  # every prompt ran in a worker of the cluster, none in the flow-run process
    assert set(stack.keys.authorizations) == {"Bearer from-dask-worker"}
    assert float(stack.artifacts(run.id)["progress"].data) == 100.0


def test_the_slurm_deployment_runs_the_batches_on_slurm_jobs_and_leaves_none(stack, tmp_path, slurm):
    from hermes.run import slurm as slurm_jobs

    with stack.client() as client:
        deployment = client.read_deployment_by_name("batch-run/slurm")
    shipped = deployment.parameters["settings"]
    assert shipped["cluster"] == "slurm"
    assert {k: shipped[k] for k in ("slurm_walltime", "slurm_cores", "slurm_memory", "slurm_max_jobs")} == \
        {"slurm_walltime": "01:00:00", "slurm_cores": 4, "slurm_memory": "8GB", "slurm_max_jobs": 4}
    fields = deployment.parameter_openapi_schema["definitions"]["RunSettings"]["properties"]
    assert all(fields[k]["description"] for k in shipped if k.startswith("slurm_"))

    prompts = [f"on slurm {i} " + script({"reasoning": "r", "content": f"a {i}"}) for i in range(6)]
    # the shipped Slurm settings, with a scheduler on loopback and jobs sized for this one machine
    settings = {**shipped, **stack.settings(write_dataset(tmp_path / "slurm.jsonl", [{"prompt": p} for p in prompts]),
                                            ON_SLURM, distribution="terminal_only", sandbox={"backend": "local"},
                                            max_no_tool_use_share=1),  # prose answers: questions that merely offer tools
                "slurm_scheduler_host": "127.0.0.1", "slurm_memory": "2GB", "slurm_cores": 2, "slurm_max_jobs": 2}
    run = stack.wait_final(stack.run_deployment("batch-run/slurm", "--params", json.dumps({"settings": settings})))
    assert run.state.type.value == "COMPLETED", run.state.message
    out = stack.data / ON_SLURM
    assert sorted(e["conversations"][1]["value"] for e in read_jsonl(out / "trajectories.jsonl")) == sorted(prompts)
    assert list((out / "slurm").glob(f"hermes-{ON_SLURM}-*.err")), "no worker job ran"
    assert [j for j in slurm_jobs.jobs() if j.name == slurm_jobs.job_name(ON_SLURM)] == []


def test_run_fails_clearly_when_too_many_prompts_fail(stack, tmp_path, docker_engine):
    rows = [{"prompt": "this one works"}] + [
        {"prompt": f"broken {i} " + script({"error": 400})} for i in range(3)]
    settings = stack.settings(write_dataset(tmp_path / "bad.jsonl", rows), TOO_MANY_FAILED, max_failed_share=0.5)
    stack.keys.authorizations.clear()
    run_id = stack.run_deployment("batch-run/batch-run", "--params", json.dumps({"settings": settings}))
    run = stack.wait_final(run_id)
    assert run.state.type.value == "FAILED"
    # No Secret block named: the key is the worker's environment's (HERMES_API_KEY).
    assert stack.keys.authorizations and set(stack.keys.authorizations) == {"Bearer from-worker-env"}
    message = run.state.message
    assert "TooManyFailedPrompts: 3 of 4 prompts failed (75%)" in message
    assert "max_failed_share=0.5" in message and "resume=true" in message

    out = stack.data / TOO_MANY_FAILED  # the outputs are written all the same
    assert [e["conversations"][1]["value"] for e in read_jsonl(out / "trajectories.jsonl")] == ["this one works"]
    assert json.loads((out / "statistics.json").read_text())["prompts_failed"] == 3
    assert containers_of(docker_engine, TOO_MANY_FAILED) == []

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
    settings = stack.settings(write_dataset(tmp_path / "p.jsonl", [{"prompt": "hello"}]), BUSY)
    lock = RunLock(stack.data / BUSY)  # another invocation of the run holds its folder
    lock.acquire()
    try:
        run = stack.wait_final(stack.run_deployment("batch-run/batch-run", "--params", json.dumps({"settings": settings})))
    finally:
        lock.release()
    assert run.state.type.value == "FAILED"
    assert "RunRefused" in run.state.message and "is in use by pid" in run.state.message
    assert "cannot run at once" in run.state.message
    assert not list((stack.data / BUSY).glob("batch_*.jsonl"))


def test_scheduled_deployment_gets_a_folder_per_run(stack, tmp_path, docker_engine):
    """The nightly deployment, started by hand: -p replaces `settings` whole; stamp_run_name stays on."""
    settings = stack.settings(write_dataset(tmp_path / "eval.jsonl", [{"prompt": f"eval {i}"} for i in range(2)]),
                              NIGHTLY)
    run = stack.wait_final(stack.run_deployment("batch-run/nightly-eval", "-p", f"settings={json.dumps(settings)}"))
    assert run.state.type.value == "COMPLETED", run.state.message
    [folder] = [p for p in stack.data.glob(f"{NIGHTLY}-*") if p.is_dir()]
    assert re.fullmatch(re.escape(NIGHTLY) + r"-\d{4}-\d\d-\d\dT\d{6}Z", folder.name)
    assert run.name == f"batch-{folder.name}"
    assert len(read_jsonl(folder / "trajectories.jsonl")) == 2
    RUN_NAMES.append(folder.name)
    assert containers_of(docker_engine, folder.name) == []


def test_typos_are_refused_when_the_run_is_created(stack, tmp_path):
    """A misspelt key, an unknown distribution, an impossible memory size: refused at submit, naming the field."""
    from prefect.exceptions import PrefectHTTPStatusError

    dataset = write_dataset(tmp_path / "p.jsonl", [{"prompt": "hello"}])
    good = stack.settings(dataset, TYPOS)
    with stack.client() as client:
        deployment = client.read_deployment_by_name("batch-run/batch-run")
        for bad, field, says in [({"max_sample": 3}, "settings", "max_sample"),
                                 ({"distribution": "nope"}, "settings.distribution", "'nope' is not one of"),
                                 ({"sandbox": {"memory": "lots"}}, "settings.sandbox.memory", "'lots' does not match")]:
            with pytest.raises(PrefectHTTPStatusError) as refused:
                client.create_flow_run_from_deployment(deployment.id, parameters={"settings": {**good, **bad}})
            detail = refused.value.response.json()["detail"]
            assert f"Validation failed for field '{field}'" in detail and says in detail, detail
        runs = client.read_flow_runs()
    assert not [r for r in runs if r.parameters.get("settings", {}).get("run_name") == TYPOS]  # none was made

    # A dataset that does not exist fails the run at once, naming it.
    missing = stack.settings(tmp_path / "no-such.jsonl", NO_DATASET)
    run = stack.wait_final(stack.run_deployment("batch-run/batch-run", "--params", json.dumps({"settings": missing})))
    assert run.state.type.value == "FAILED" and str(tmp_path / "no-such.jsonl") in run.state.message


def _sleepy(text: str, seconds: int) -> dict:
    return {"prompt": f"{text} " + script(
        {"reasoning": "wait", "tool_calls": [{"name": "terminal", "arguments": {"command": f"sleep {seconds}"}}]},
        {"reasoning": "ok", "content": "done"})}


def _journal(out: Path) -> list[dict]:
    return [e for p in sorted(out.glob("batch_*.jsonl")) for e in read_jsonl(p)]


def test_a_run_whose_process_dies_is_crashed_and_retry_resumes_it(stack, tmp_path, docker_engine):
    """kill -9 of the worker and its flow-run process mid-run: the shipped automation (its window
    shortened to QUICK_WINDOW) marks the run Crashed (its heartbeats stopped), Retry resumes it, every
    prompt is in the output once."""
    rows = [{"prompt": f"quick {i}"} for i in range(3)] + [_sleepy(f"slow {i}", 6) for i in range(3)]
    settings = stack.settings(write_dataset(tmp_path / "p.jsonl", rows), KILLED, num_workers=6)
    run_id = stack.run_deployment("batch-run/batch-run", "--params", json.dumps({"settings": settings}))
    out = stack.data / KILLED
    until(lambda: out.is_dir() and len(_journal(out)) >= 3 and len(containers_of(docker_engine, KILLED)) >= 3,
          "the quick prompts done, the slow ones in their containers", timeout=180)
    for pid in [stack.worker.pid, *_descendants(stack.worker.pid)]:
        _signal(pid, signal.SIGKILL)
    stack.worker.wait()
    done_before = len(_journal(out))

    deadline = time.monotonic() + CRASH_WAIT
    with stack.client() as client:
        while (state := client.read_flow_run(run_id).state).type.value != "CRASHED":
            assert state.type.value == "RUNNING" and time.monotonic() < deadline, f"{state.type.value} {state.message}"
            time.sleep(2)
    assert "heartbeat" in state.message

    with stack.client() as client:
        before_retry = {t.id for t in _batch_task_runs(client, run_id)}
    stack.start_worker()
    retried = stack.prefect("flow-run", "retry", run_id)
    assert "retry" in retried.stdout.lower(), retried.stdout
    run = stack.wait_final(run_id)
    assert run.state.type.value == "COMPLETED", f"{run.state.message}\n{stack.worker_log.read_text()[-5000:]}"
    entries = read_jsonl(out / "trajectories.jsonl")
    assert sorted(e["conversations"][1]["value"] for e in entries) == sorted(r["prompt"] for r in rows)
    assert done_before >= 3 and len(_journal(out)) == len(rows)  # what had finished did not run again
    assert containers_of(docker_engine, KILLED) == []
    # the retried flow run's batch task runs cover what was owed, and only that
    def after_retry() -> list:
        with stack.client() as client:
            return [t for t in _batch_task_runs(client, run_id) if t.id not in before_retry]

    # the server records task runs' states from their events in the background: read once final
    after = until(lambda: (found := after_retry()) and all(t.state.is_final() for t in found) and found,
                  "the retried run's batch task runs to be recorded as final", 60)
    assert all(t.state.type.value == "COMPLETED" for t in after), [(t.name, t.state) for t in after]
    sizes = [int(re.match(r"batch \d+: (\d+) prompt", t.state.message).group(1)) for t in after]
    assert sum(sizes) == len(rows) - done_before


def test_two_scheduled_runs_of_the_batch_deployment_get_two_folders(stack, tmp_path, docker_engine):
    """A schedule added to batch-run (its run_name fixed): each scheduled run gets its own folder."""
    from datetime import datetime, timedelta, timezone

    from prefect.client.schemas.schedules import RRuleSchedule

    settings = stack.settings(write_dataset(tmp_path / "p.jsonl", [{"prompt": "scheduled hello"}]), EVERY)
    # The scheduler (every second here) only makes runs for times still to come: the first is
    # far enough ahead for it to see on a loaded machine.
    start = (datetime.now(timezone.utc) + timedelta(seconds=6)).strftime("%Y%m%dT%H%M%SZ")
    with stack.client() as client:
        deployment = client.read_deployment_by_name("batch-run/batch-run")
        [schedule] = client.create_deployment_schedules(
            deployment.id, [(RRuleSchedule(rrule=f"DTSTART:{start}\nRRULE:FREQ=SECONDLY;INTERVAL=5;COUNT=2"), True)],
            parameters={"settings": settings})
        try:
            def scheduled():
                return [r for r in client.read_flow_runs() if r.deployment_id == deployment.id
                        and "auto-scheduled" in r.tags]
            until(lambda: len(scheduled()) == 2, "two runs from the schedule", timeout=120)
            runs = [stack.wait_final(r.id) for r in scheduled()]
        finally:
            client.delete_deployment_schedule(deployment.id, schedule.id)
    assert [r.state.type.value for r in runs] == ["COMPLETED", "COMPLETED"], [r.state.message for r in runs]
    folders = sorted(p.name for p in stack.data.glob(f"{EVERY}-*") if p.is_dir())
    RUN_NAMES.extend(folders)
    assert len(folders) == 2 and sorted(r.name for r in runs) == [f"batch-{f}" for f in folders]
    for folder in folders:
        assert [e["conversations"][1]["value"] for e in read_jsonl(stack.data / folder / "trajectories.jsonl")] \
            == ["scheduled hello"]


def test_a_run_finishes_when_the_prefect_server_goes_away(own_stack, tmp_path, docker_engine):
    stack = own_stack  # it stops this server: the module's is not touched
    rows = [_sleepy(f"slow {i}", 4) for i in range(4)] + [{"prompt": f"quick {i}"} for i in range(2)]
    settings = stack.settings(write_dataset(tmp_path / "p.jsonl", rows), SERVER_GONE, num_workers=2)
    stack.run_deployment("batch-run/batch-run", "--params", json.dumps({"settings": settings}))
    out = stack.data / SERVER_GONE
    until(lambda: len(containers_of(docker_engine, SERVER_GONE)) >= 1, "the run under way", timeout=180)
    stack.server.stop()

    until(lambda: "PREFECT LOST" in stack.worker_log.read_text(errors="replace"), "the run to say Prefect was lost",
          timeout=300)
    until(lambda: not _descendants(stack.worker.pid), "the flow-run process to exit", timeout=60)
    log = stack.worker_log.read_text(errors="replace")
    assert "the run finished without it" in log and str(out / "trajectories.jsonl") in log
    entries = read_jsonl(out / "trajectories.jsonl")
    assert sorted(e["conversations"][1]["value"] for e in entries) == sorted(r["prompt"] for r in rows)
    assert json.loads((out / "statistics.json").read_text())["trajectories_written"] == len(rows)
    assert containers_of(docker_engine, SERVER_GONE) == []
