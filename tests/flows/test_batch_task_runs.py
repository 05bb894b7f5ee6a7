"""What a user sees of a default-path run in Prefect: one task run per batch, in the UI the run prints.

The installed `hermes-batch` command, as a user types it (no PREFECT_API_URL: the local background
server), on real Docker sandboxes, against the bundled model server. Then Prefect's own REST API
says what the run left there (task runs, states, tags, logs, the graph), and real Chromium opens the
address the run printed and finds the batches on the flow run's page.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from flows import local_server
from hermes.settings import API_KEY_ENV_VARS
from mockllm import MockLLM
from tests.helpers import script, unique_run, until, write_dataset
from tests.prefect_server import migrated_database

pytestmark = [pytest.mark.prefect, pytest.mark.docker]

UI_LINE = re.compile(r"^Prefect UI: (http://127\.0\.0\.1:\d+) \(stop it with `hermes-batch server stop`\)$", re.M)
FAILING = 21  # the prompt the model answers 400: in batch 5 (prompts 20-23)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect-home")
    shutil.copyfile(migrated_database(), home / "prefect.db")
    yield home
    local_server.stop(home)


@pytest.fixture(scope="module")
def llm():
    with MockLLM() as server:
        yield server


def hermes_batch(cwd: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    """The console script of the installed package, in an environment like a new user's shell."""
    exe = shutil.which("hermes-batch")
    assert exe, "the hermes-batch command is not installed (pip install -e .)"
    drop = {*API_KEY_ENV_VARS, "HERMES_ENGINE", "PREFECT_API_URL", local_server.MODE_ENV}
    env = {**{k: v for k, v in os.environ.items() if k not in drop}, "PREFECT_HOME": str(home)}
    return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def run(tmp_path: Path, home: Path, llm: MockLLM, name: str, rows: list[dict], batch_size: int):
    dataset = write_dataset(tmp_path / f"{name}.jsonl", rows)
    done = hermes_batch(tmp_path, home, "run", f"--dataset_file={dataset}", f"--batch_size={batch_size}",
                        f"--run_name={name}", f"--base_url={llm.base_url}", "--model=mock-model", "--api_key=k",
                        "--num_workers=4", "--distribution=terminal_only", "--max_retries=0")
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    found = UI_LINE.findall(done.stdout)
    assert len(found) == 1, done.stdout[-3000:]
    return found[0], done


def flow_run_of(ui: str, name: str) -> dict:
    runs = httpx.post(f"{ui}/api/flow_runs/filter", json={"flow_runs": {"name": {"any_": [f"batch-{name}"]}}}).json()
    assert len(runs) == 1, runs
    return runs[0]


def task_runs_of(ui: str, flow_run_id: str) -> dict[str, dict]:
    """The flow run's task runs by name, once the server has recorded each one's final state (it
    records them from the run's events in the background, a flush a second)."""
    def read() -> list[dict]:
        return httpx.post(f"{ui}/api/task_runs/filter",
                          json={"task_runs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200}).json()

    final = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
    steps = ("plan-run", "merge-run", "publish-report")  # the run's own, beside its batches

    def recorded(runs: list[dict]) -> bool:
        # The server records task runs from their events in the background: one may be there with no
        # state yet (null), or (on a loaded machine) the last steps not there at all yet.
        return (all((t["state"] or {}).get("type") in final for t in runs)
                and all(any(t["name"].startswith(step) for t in runs) for step in steps))

    found = until(lambda: (runs := read()) and recorded(runs) and runs,
                  "every task run and its final state to be recorded", 60)
    by_name = {t["name"]: t for t in found}
    assert len(by_name) == len(found), [t["name"] for t in found]  # every task run named once
    return by_name


def logs_of(ui: str, task_run_id: str) -> list[str]:
    found = httpx.post(f"{ui}/api/logs/filter", json={"logs": {"task_run_id": {"any_": [task_run_id]}},
                                                       "limit": 200}).json()
    return [entry["message"] for entry in found]


def open_in_chromium(url: str, expect: list[str]) -> str:
    """The page's text once every name in `expect` shows as a link on the flow run's Task Runs tab."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--no-first-run", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url, wait_until="networkidle")
            page.get_by_text("Task Runs", exact=True).first.click()  # the tab (the URL's ?tab= is not read on load)
            for name in expect:  # each a link to its task run's page in the flow run's list
                page.locator("a[href^='/runs/task-run/']").get_by_text(name, exact=True).first.wait_for(timeout=60_000)
            return page.inner_text("body")
        finally:
            browser.close()


def test_a_default_path_run_is_one_task_run_per_batch_in_the_ui_it_prints(tmp_path, home, llm, docker_engine):
    name = unique_run("fanout")
    rows = [{"prompt": f"prompt {i}"} for i in range(24)]
    rows[FAILING] = {"prompt": "broken " + script({"error": 400})}
    ui, done = run(tmp_path, home, llm, name, rows, batch_size=4)  # 1 of 24 failed: under max_failed_share, exit 0
    assert httpx.get(f"{ui}/ui-settings").json()["api_url"] == f"{ui}/api"  # the page calls this server

    flow_run = flow_run_of(ui, name)
    assert flow_run["state"]["type"] == "COMPLETED"
    tasks = task_runs_of(ui, flow_run["id"])
    batches = {n: t for n, t in tasks.items() if n.startswith("batch-")}
    assert sorted(batches) == [f"batch-{i}" for i in range(6)]
    for n, t in batches.items():
        assert {"hermes-batch", f"run:{name}", "prompts:4"} <= set(t["tags"]), t["tags"]
        if n != "batch-5":
            assert t["state"]["type"] == "COMPLETED", t["state"]
            assert t["state"]["message"] == f"batch {n[6:]}: 4 prompt(s), 4 completed"
    failed = batches["batch-5"]["state"]
    assert failed["type"] == "FAILED" and failed["name"] == "PromptsFailed"
    assert failed["message"].startswith("batch 5: 1 of 4 prompt(s) failed; commonest: model endpoint 400 (1)")

    # the batch's page carries its prompts' lines: each start and end, and the failure's reason
    lines = logs_of(ui, batches["batch-5"]["id"])
    for i in (20, 22, 23):
        assert any(m.startswith(f"prompt {i} started:") for m in lines), lines
        assert any(m.startswith(f"prompt {i} completed in ") for m in lines), lines
    assert any(m.startswith(f"prompt {FAILING} failed: model endpoint answered 400") for m in lines), lines

    # the graph: plan -> every batch -> merge -> report
    graph = httpx.get(f"{ui}/api/flow_runs/{flow_run['id']}/graph-v2").json()
    parents = {node["label"]: {p["id"] for p in node["parents"]} for _, node in graph["nodes"]}
    ids = {node["label"]: node_id for node_id, node in graph["nodes"]}
    plan = next(label for label in parents if label.startswith("plan-run"))
    merge = next(label for label in parents if label.startswith("merge-run"))
    report = next(label for label in parents if label.startswith("publish-report"))
    assert parents[plan] == set()
    assert all(parents[b] == {ids[plan]} for b in batches)
    assert parents[merge] == {ids[b] for b in batches}
    assert ids[merge] in parents[report]

    text = open_in_chromium(f"{ui}/runs/flow-run/{flow_run['id']}", [f"batch-{i}" for i in range(6)])
    assert "Can't connect" not in text and f"batch-{name}" in text

    # the server replaced on a new port (stopped; the next run starts another): its UI is its own
    stopped = hermes_batch(tmp_path, home, "server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    again = unique_run("fanout-again")
    ui2, _ = run(tmp_path, home, llm, again, [{"prompt": f"again {i}"} for i in range(4)], batch_size=2)
    status = hermes_batch(tmp_path, home, "server", "status")
    assert f"Prefect UI: {ui2}\n" in status.stdout  # `server status` prints the same working address
    assert httpx.get(f"{ui2}/ui-settings").json()["api_url"] == f"{ui2}/api"
    second = flow_run_of(ui2, again)
    text = open_in_chromium(f"{ui2}/runs/flow-run/{second['id']}", ["batch-0", "batch-1"])
    assert "Can't connect" not in text and f"batch-{again}" in text


def test_a_server_recorded_before_its_ui_knew_its_port_is_replaced(home, tmp_path):
    """A background server started by an earlier version (its UI calling :4200) is not reused."""
    state, _ = local_server.ensure(home)
    stale = state.model_copy(update={"ui_api_url": ""})
    (home / local_server.STATE_FILE).write_text(stale.model_dump_json())
    fresh, started = local_server.ensure(home)
    assert started and fresh.pid != state.pid and fresh.ui_api_url == fresh.api_url
    assert not local_server.running(state.pid)
    with pytest.raises(ProcessLookupError):
        os.kill(state.pid, signal.SIGCONT)  # the old one is gone, not left holding its port
    assert json.loads((home / local_server.STATE_FILE).read_text())["ui_api_url"] == fresh.api_url


def test_dask_address_on_the_command_line_runs_batches_on_the_clusters_workers_in_docker(tmp_path, home, llm,
                                                                                        docker_engine):
    """`hermes-batch run --dask_address ...` as typed: batches are task runs on the background server,
    each prompt's container made by a worker process of the cluster, none left after the run."""
    import time

    distributed = pytest.importorskip("distributed")
    name = unique_run("dask-cli")
    rows = [{"prompt": f"boxed {i} " + script(
        {"reasoning": "look", "tool_calls": [{"name": "terminal", "arguments": {"command": f"echo in-box-{i}"}}]},
        {"reasoning": "done", "content": "ok"})} for i in range(6)]
    dataset = write_dataset(tmp_path / "dask.jsonl", rows)
    since = time.time()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
                                  worker_dashboard_address=None) as cluster, \
            distributed.Client(cluster.scheduler_address, timeout=30) as client:
        workers = set(client.run(os.getpid).values())
        done = hermes_batch(tmp_path, home, "run", f"--dataset_file={dataset}", "--batch_size=2", f"--run_name={name}",
                            f"--base_url={llm.base_url}", "--model=mock-model", "--api_key=k", "--num_workers=4",
                            "--distribution=terminal_only", f"--dask_address={cluster.scheduler_address}")
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (ui,) = UI_LINE.findall(done.stdout)
    tasks = task_runs_of(ui, flow_run_of(ui, name)["id"])
    assert sorted(n for n in tasks if n.startswith("batch-")) == ["batch-0", "batch-1", "batch-2"]
    assert all("prompts:2" in t["tags"] for n, t in tasks.items() if n.startswith("batch-"))
    trajectories = [json.loads(line) for line in (tmp_path / "data" / name / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajectories) == 6
    outputs = {json.dumps(t["conversations"]) for t in trajectories}
    assert all(any(f"in-box-{i}" in o for o in outputs) for i in range(6))
    # who made each container: the engine's own record of it (its create event's owner label)
    created = docker_engine.api.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True, filters={
        "type": "container", "event": "create", "label": f"hermes-batch.run={name}"})
    owners = {int(e["Actor"]["Attributes"]["hermes-batch.owner"].rpartition(":")[2]) for e in created}
    assert owners and owners <= workers, (owners, workers)  # the workers' processes, not the flow's
    assert docker_engine.containers.list(all=True, filters={"label": f"hermes-batch.run={name}"}) == []
