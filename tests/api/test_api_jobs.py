"""/api/jobs for real: `hermes-batch serve` as its own process, wired to a real `prefect server
start`; each job a Prefect deployment with its cron schedule, executed by the process worker the
server starts (`--jobs-worker`) in a Docker sandbox against the scripted model server."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from zoneinfo import ZoneInfo
from typing import Iterator

import httpx
import pytest

from mockllm import MockLLM
from tests.prefect_server import running_prefect_server
from tests.helpers import until, free_port

REPO = Path(__file__).resolve().parents[2]
KEY = "jobs-key-5d2"
pytestmark = [pytest.mark.prefect, pytest.mark.docker]


@pytest.fixture(scope="module")
def prefect(tmp_path_factory):
    with running_prefect_server(tmp_path_factory.mktemp("prefect")) as server:
        yield server


@pytest.fixture(scope="module")
def mock():
    with MockLLM() as server:
        yield server


@pytest.fixture(scope="module")
def api(prefect, mock, sandbox_image, tmp_path_factory) -> Iterator[httpx.Client]:
    home = tmp_path_factory.mktemp("serve")
    port = free_port()
    env = {**prefect.env, "API_SERVER_KEY": KEY, "API_SERVER_PORT": str(port), "HERMES_HOME": str(home),
           "HERMES_BASE_URL": mock.base_url, "HERMES_MODEL": "mock-upstream",
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1"}
    log = home / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--jobs-worker", "--log-level", "warning"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        until(up, "hermes-batch serve to answer", timeout=180)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as client:
            yield client
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its worker, one process group
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def prefect_client(prefect):
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect.api_url}):
        with get_client(sync_client=True) as client:
            yield client


def test_a_prompt_job_is_a_scheduled_prefect_deployment_paused_resumed_run_and_deleted(api, prefect_client):
    from prefect.client.schemas.objects import StateType

    prompt = "MOCK_SCRIPT: " + json.dumps({"turns": [
        {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo from-the-sandbox"}}]},
        {"content": "The nightly answer."}]})
    r = api.post("/api/jobs", json={"name": "nightly-question", "prompt": prompt, "schedule": "0 3 * * *",
                                    "timezone": "Europe/Berlin", "description": "asks every night"})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["object"] == "hermes.job" and job["kind"] == "prompt" and job["prompt"] == prompt
    assert (job["schedule"], job["timezone"], job["paused"], job["state"]) == ("0 3 * * *", "Europe/Berlin", False, "scheduled")
    assert job["description"] == "asks every night"
    next_run = datetime.fromisoformat(job["next_run_at"]).astimezone(ZoneInfo("Europe/Berlin"))
    assert (next_run.hour, next_run.minute) == (3, 0) and next_run > datetime.now(timezone.utc)

    # it is a real Prefect deployment, with its schedule, in the jobs' work pool
    deployment = prefect_client.read_deployment(job["id"])
    assert deployment.name == "nightly-question" and "hermes-job" in deployment.tags
    assert deployment.work_pool_name == "hermes" and deployment.entrypoint == "flows/scheduled_jobs.py:agent_prompt"
    assert deployment.parameters == {"prompt": prompt}
    [schedule] = deployment.schedules
    assert schedule.schedule.cron == "0 3 * * *" and schedule.schedule.timezone == "Europe/Berlin" and schedule.active
    assert prefect_client.read_flow(deployment.flow_id).name == "agent-prompt"

    assert [j["id"] for j in api.get("/api/jobs").json()["data"]] == [job["id"]]
    assert api.get(f"/api/jobs/{job['id']}").json()["name"] == "nightly-question"

    paused = api.post(f"/api/jobs/{job['id']}/pause").json()
    assert paused["paused"] is True and paused["state"] == "paused" and paused["next_run_at"] is None
    deployment = prefect_client.read_deployment(job["id"])
    assert deployment.paused and not deployment.schedules[0].active
    resumed = api.post(f"/api/jobs/{job['id']}/resume").json()
    assert resumed["paused"] is False and resumed["state"] == "scheduled"
    deployment = prefect_client.read_deployment(job["id"])
    assert not deployment.paused and deployment.schedules[0].active

    patched = api.patch(f"/api/jobs/{job['id']}", json={"schedule": "30 4 * * 1-5", "instructions": "Be brief."}).json()
    assert (patched["schedule"], patched["timezone"], patched["instructions"], patched["prompt"]) == (
        "30 4 * * 1-5", "Europe/Berlin", "Be brief.", prompt)
    deployment = prefect_client.read_deployment(job["id"])
    assert deployment.schedules[0].schedule.cron == "30 4 * * 1-5"
    assert deployment.parameters == {"prompt": prompt, "instructions": "Be brief."}

    # run now: a flow run of the deployment, which the worker picks up and runs to the end
    run = api.post(f"/api/jobs/{job['id']}/run")
    assert run.status_code == 202
    flow_run = prefect_client.read_flow_run(run.json()["run_id"])
    assert str(flow_run.deployment_id) == job["id"]

    def finished():
        state = prefect_client.read_flow_run(flow_run.id).state
        return state if state.is_final() else None

    state = until(finished, "the job's flow run to finish", timeout=180)
    assert state.type == StateType.COMPLETED, state

    def answer_logged():
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        logs = prefect_client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])))
        return any("The nightly answer." in log.message for log in logs)

    until(answer_logged, "the agent's answer in the flow run's logs", timeout=180)  # the agent ran, tools and all
    assert api.get(f"/api/jobs/{job['id']}").json()["last_run"]["state"] == "completed"

    assert api.delete(f"/api/jobs/{job['id']}").json() == {"object": "hermes.job", "id": job["id"], "deleted": True}
    assert api.get(f"/api/jobs/{job['id']}").status_code == 404
    assert api.get("/api/jobs").json()["data"] == []


def test_batch_jobs_and_bad_job_requests(api, prefect_client):
    batch = {"dataset_file": "deployments/demo/prompts.jsonl", "batch_size": 5, "run_name": "api-nightly",
             "model": "mock-upstream", "base_url": "http://127.0.0.1:9/v1"}
    r = api.post("/api/jobs", json={"name": "nightly-batch", "batch": batch, "schedule": "0 2 * * *", "paused": True})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["kind"] == "batch" and job["paused"] is True and job["batch"] == batch
    assert job["next_run_at"] is None and job["description"] is None
    deployment = prefect_client.read_deployment(job["id"])
    assert deployment.entrypoint == "flows/batch.py:batch_run" and deployment.paused
    assert deployment.parameters == {"settings": batch, "stamp_run_name": True}  # one run folder per run
    assert prefect_client.read_flow(deployment.flow_id).name == "batch-run"

    def error(response: httpx.Response, status: int, code: str) -> dict:
        assert response.status_code == status, response.text
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.json()["error"]["code"] == code
        return response.json()["error"]

    error(api.post("/api/jobs", json={"name": "nightly-batch", "batch": batch}), 409, "job_exists")
    error(api.post("/api/jobs", json={"name": "x", "batch": {"dataset_file": "d.jsonl"}}), 400, "invalid_request")
    error(api.post("/api/jobs", json={"name": "x", "prompt": "p", "batch": batch}), 400, "invalid_request")
    error(api.post("/api/jobs", json={"name": "x", "prompt": "p", "schedule": "every day"}), 400, "invalid_request")
    error(api.post("/api/jobs", json={"name": "x", "prompt": "p", "schedule": "0 3 * * *", "timezone": "Mars/Base"}),
          400, "invalid_request")
    error(api.post("/api/jobs", json={"name": "has space", "prompt": "p"}), 400, "invalid_request")
    error(api.post("/api/jobs", json={"name": "x", "prompt": "p", "deliver": "telegram"}), 400, "invalid_request")
    # well-formed, but not what a batch job has: a conflict with the job as it is
    error(api.patch(f"/api/jobs/{job['id']}", json={"prompt": "a batch has none"}), 409, "job_kind_mismatch")
    for method, path in (("GET", ""), ("PATCH", ""), ("DELETE", ""), ("POST", "/pause"), ("POST", "/resume"), ("POST", "/run")):
        for unknown in ("00000000-0000-0000-0000-000000000000", "not-a-uuid"):
            kwargs = {"json": {}} if method == "PATCH" else {}
            error(api.request(method, f"/api/jobs/{unknown}{path}", **kwargs), 404, "not_found")
    assert api.delete(f"/api/jobs/{job['id']}").status_code == 200
    assert api.get("/api/jobs").json()["data"] == []


def test_deployments_that_are_not_jobs_are_not_the_apis_to_see_or_touch(api, prefect_client):
    flow_id = prefect_client.create_flow_from_name("someone-elses-flow")
    hidden = prefect_client.create_deployment(flow_id=flow_id, name="not-a-job", tags=["other-team"])
    def state(d) -> tuple:
        return d.name, d.paused, d.description, d.parameters, sorted(d.tags)

    before = state(prefect_client.read_deployment(hidden))
    try:
        job = api.post("/api/jobs", json={"name": "a-job", "prompt": "p"}).json()
        assert [j["id"] for j in api.get("/api/jobs").json()["data"]] == [job["id"]]
        for method, path in (("GET", ""), ("PATCH", ""), ("DELETE", ""), ("POST", "/pause"), ("POST", "/run")):
            r = api.request(method, f"/api/jobs/{hidden}{path}", **({"json": {"description": "x"}} if method == "PATCH" else {}))
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", (method, path, r.text)
        # untouched: not paused, not changed, not deleted, never run
        assert state(prefect_client.read_deployment(hidden)) == before
        assert [r for r in prefect_client.read_flow_runs() if r.deployment_id == hidden] == []
        assert api.delete(f"/api/jobs/{job['id']}").status_code == 200
    finally:
        prefect_client.delete_deployment(hidden)


def test_serve_reports_jobs_ready(api):
    assert api.get("/v1/capabilities").json()["features"]["jobs"] is True
    assert api.get("/health/detailed").json()["readiness"]["checks"]["jobs"]["status"] == "ok"


def test_hermes_never_imports_prefect():
    code = ("import sys, hermes.api.app, hermes.api.server, hermes.api.jobs; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
