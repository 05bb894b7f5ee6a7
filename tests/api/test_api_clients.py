"""The API server as real clients found it (issue 16): the official openai SDKs (Python, and
openai-node 4.x and 6.x), browsers' CORS preflights, clients that hang up, raw HTTP. Each
test names the item it covers; uvicorn serves on a loopback port, the scripted model server
is upstream, and tools run in real Docker sandboxes."""
from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from hermes.api import create_app
from hermes.api.server import ServerThread
from mockllm import MockLLM
from tests.helpers import free_port, script, until
from tests.api.test_api_server import HOLD, KEY, api_containers, assert_error, read_events, release, settings, terminal

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "tests" / "node"


@pytest.fixture(scope="module")
def mock():
    with MockLLM() as server:
        yield server


@pytest.fixture(scope="module")
def server(mock, sandbox_image, tmp_path_factory) -> Iterator[ServerThread]:
    # commands are never timed out here: what ends a held command must be the stop itself
    with ServerThread(create_app(settings(mock, tmp_path_factory.mktemp("clients"), command_timeout=900))) as srv:
        yield srv


@pytest.fixture
def one_slot(mock, sandbox_image, tmp_path) -> Iterator[ServerThread]:
    """One agent run at a time, the default Retry-After (5 s)."""
    with ServerThread(create_app(settings(mock, tmp_path, max_concurrent_runs=1))) as srv:
        yield srv


def client(srv: ServerThread, **kw) -> httpx.Client:
    return httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120, **kw)


def sdk(srv: ServerThread, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0, **kw)


def label(srv: ServerThread) -> str:
    return srv.server.config.app.state.service.label


def agent_runs(http: httpx.Client) -> dict:
    return http.get("/health/detailed").json()["agent_runs"]


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


# --------------------------------------------------------------------------- 1. idempotency


def test_1_a_429_is_not_replayed_for_its_idempotency_key(one_slot, docker_engine):
    with client(one_slot) as http:
        run_id = http.post("/v1/runs", json={"input": script(terminal(HOLD))}).json()["run_id"]
        api = sdk(one_slot)
        with pytest.raises(openai.RateLimitError):
            api.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                        extra_headers={"Idempotency-Key": "retry-me"})
        release(docker_engine, **{"hermes-batch.prompt": run_id[4:16]})
        until(lambda: http.get(f"/v1/runs/{run_id}").json()["status"] == "completed", "the slot to free")
        # the retry with the same key gets through: the refusal was not kept as "the answer"
        answer = api.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}], extra_headers={"Idempotency-Key": "retry-me"})
        assert answer.http_request.headers["idempotency-key"] == "retry-me"
        assert answer.headers.get("idempotent-replayed") is None
        assert answer.parse().choices[0].message.content.startswith("Done.")
        # and now that it completed, that answer is the one replayed
        again = http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                          headers={"Idempotency-Key": "retry-me"})
        assert again.headers["idempotent-replayed"] == "true" and again.json()["id"] == answer.parse().id


# --------------------------------------------------------------------------- 2. dropped event streams


def test_2_a_dropped_runs_event_stream_is_quiet_and_the_run_is_still_swept(mock, sandbox_image, tmp_path):
    captured = Captured()
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "asyncio", "hermes")]
    # The sweeper runs every events_ttl / 4 seconds: 2.5 s here (15 s with a 60 s ttl), while each
    # run's events, read within a second or two of its start, are kept for 10 s.
    with ServerThread(create_app(settings(mock, tmp_path, run_retention=0.5, run_events_ttl=10))) as srv, client(srv) as http:
        for log in loggers:
            log.addHandler(captured)
        try:
            run_ids = []
            for _ in range(4):  # a long answer: hundreds of buffered events behind the first line
                run_id = http.post("/v1/runs", json={"input": script({"content": "word " * 4000})}).json()["run_id"]
                until(lambda: http.get(f"/v1/runs/{run_id}").json()["status"] == "completed", "the run")
                with http.stream("GET", f"/v1/runs/{run_id}/events") as r:
                    first = next(line for line in r.iter_lines() if line)
                assert first == "event: run.started"  # read one line, then hang up
                run_ids.append(run_id)
            # retention works as for a run read to its end: each run is swept
            for run_id in run_ids:
                until(lambda: http.get(f"/v1/runs/{run_id}").status_code == 404, "the dropped run to be swept", timeout=60)
        finally:
            for log in loggers:
                log.removeHandler(captured)
    problems = [r.getMessage() for r in captured.records if r.levelno >= logging.WARNING]
    assert problems == []  # no "Exception in ASGI application", no BrokenResourceError


# --------------------------------------------------------------------------- 3. clients that leave


def stop_state(srv: ServerThread, engine) -> str:
    """Where each stop of the server's agent runs got to (for a failure message only): whether its
    close thread started and ended, and what its sandbox and container are now."""
    lines = []
    for work in list(srv.server.config.app.state.service.active):
        halt = work.halt
        closer = halt._closer
        box = halt._box
        sandbox = getattr(box, "_sandbox", None)
        cid = getattr(sandbox, "container_id", None)
        try:
            container = engine.containers.get(cid).status if cid else None
        except Exception as e:  # noqa: BLE001 - a description, whatever it finds
            container = type(e).__name__
        lines.append(f"stop asked {halt.event.is_set()}, closer {closer and (closer.ident, closer.is_alive())}, "
                     f"box closed {getattr(box, '_closed', None)}, sandbox {sandbox!r} closed "
                     f"{getattr(sandbox, '_closed', None)}, container {container}")
    return "\n".join(lines) or "no agent run in flight"


def test_3_a_non_streaming_client_that_leaves_stops_its_agent(server, mock, docker_engine):
    mock.reset()
    impatient = sdk(server, timeout=8.0)
    with pytest.raises(openai.APITimeoutError):  # the SDK gives up and closes its connection
        impatient.chat.completions.create(model="m", messages=[
            {"role": "user", "content": script(terminal(HOLD), terminal("echo never"))}])
    with client(server) as http:
        # the agent stopped without its command ever being released, and made no further model call
        # this stop has hung in full parallel runs (not reproduced alone): a failure shows what it waits on,
        # and whether the stop was asked for at all ("stopping": the client's leaving was seen)
        try:
            until(lambda: agent_runs(http)["active"] == 0, "the agent to stop", timeout=60, stacks=True)
        except AssertionError as e:
            raise AssertionError(f"agent runs now: {agent_runs(http)}\n{stop_state(server, docker_engine)}\n{e}") from None
        until(lambda: not api_containers(docker_engine, **{"hermes-batch.run": label(server)}), "the sandbox to go",
              stacks=True)
    assert len(mock.requests()) == 1


# --------------------------------------------------------------------------- 4. lone surrogates


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", b'{"messages":[{"role":"user","content":"\\ud800 x"}]}', "messages[0].content"),
    ("/v1/chat/completions", b'{"stream":true,"messages":[{"role":"user","content":"\\ud800 x"}]}', "messages[0].content"),
    ("/v1/responses", b'{"input":[{"role":"user","content":[{"type":"input_text","text":"a\\udfff"}]}]}',
     "input[0].content[0].text"),
    ("/v1/responses", b'{"input":"x","metadata":{"k":"\\ud83d"}}', "metadata.k"),
    ("/v1/runs", b'{"input":"x","instructions":"\\udc00"}', "instructions"),
])
def test_4_a_lone_surrogate_is_the_clients_bad_input(server, mock, path, body, param):
    mock.reset()
    with client(server) as http:
        before = http.get("/health/detailed").json()["runs"]
        r = http.post(path, content=body, headers={"Content-Type": "application/json"})
        err = assert_error(r, 400, "invalid_request")
        assert err["param"] == param and "surrogate" in err["message"]
        assert http.get("/health/detailed").json()["runs"] == before  # no run was started
    assert mock.requests() == []  # the model was never called


# --------------------------------------------------------------------------- 5. progress events


def progress_prompt() -> str:
    return script(terminal("echo one"), terminal("echo two"), {"content": "both ran"})


def test_5_progress_events_pass_through_both_python_sdk_loops(server):
    api = sdk(server)
    # the loop of the OpenAI docs: choices[0] of every chunk
    text, progress = "", 0
    for chunk in api.chat.completions.create(model="m", messages=[{"role": "user", "content": progress_prompt()}],
                                             stream=True):
        text += chunk.choices[0].delta.content or ""
        progress += chunk.object == "hermes.tool.progress"
    assert text == "both ran" and progress == 4  # the named events are still there: started and completed, twice
    # the SDK's stream helper, which accumulates chunks into a completion
    with api.chat.completions.stream(model="m", messages=[{"role": "user", "content": progress_prompt()}]) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "content.delta")
        final = stream.get_final_completion()
    assert deltas == "both ran" and final.choices[0].message.content == "both ran"
    # a request (or API_SERVER_TOOL_PROGRESS=false) turns them off
    chunks = list(api.chat.completions.create(model="m", messages=[{"role": "user", "content": progress_prompt()}],
                                              stream=True, extra_body={"stream_options": {"include_tool_progress": False}}))
    assert [c.object for c in chunks] == ["chat.completion.chunk"] * len(chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "both ran"


def node_stream(server: ServerThread, package: str, *progress: str) -> dict:
    node = shutil.which("node")
    if node is None or not (NODE / "node_modules" / package).is_dir():
        if os.environ.get("CI"):
            pytest.fail("node and tests/node/node_modules are needed (deployments/bootstrap.sh installs them)")
        pytest.skip("no node or no tests/node/node_modules: run `npm ci` in tests/node")
    out = subprocess.run([node, str(NODE / "stream_chat.mjs"), package, server.base_url, KEY, progress_prompt(), *progress],
                         capture_output=True, text=True, timeout=180, cwd=NODE)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_5_openai_node_reads_the_stream_with_its_readme_loop(server):
    # openai-node 6.x hands named events' data to the loop like any chunk: the empty delta passes
    seen = node_stream(server, "openai6")
    assert (seen["text"], seen["progress"]) == ("both ran", 4)
    # openai-node 4.x wraps named events as {event, data}, which has no `choices`: it turns them off
    seen = node_stream(server, "openai4", "false")
    assert (seen["text"], seen["progress"]) == ("both ran", 0) and seen["chunks"] > 0


# --------------------------------------------------------------------------- 6. CORS


def test_6_a_browser_preflight_passes_the_openai_sdks_own_headers(mock, sandbox_image, tmp_path):
    seen: list[httpx.Request] = []
    with ServerThread(create_app(settings(mock, tmp_path, cors_origins="http://ui.example"))) as srv:
        with httpx.Client(event_hooks={"request": [seen.append]}) as hooked:
            api = openai.OpenAI(base_url=srv.base_url, api_key=KEY, organization="org-1", project="proj-1",
                                max_retries=0, http_client=hooked)
            api.models.list()
        # what a browser would ask for: every header the SDK set that is not one the browser sets itself
        browser_sets = {"host", "accept", "accept-encoding", "connection", "user-agent", "content-length"}
        asked = sorted(h for h in seen[0].headers.keys() if h.lower() not in browser_sets)
        assert "x-stainless-os" in asked and "openai-organization" in asked and "x-stainless-retry-count" in asked
        pre = httpx.options(f"{srv.url}/v1/chat/completions", headers={
            "Origin": "http://ui.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": ", ".join(asked + ["content-type", "idempotency-key"])})
        assert pre.status_code == 200, pre.text
        allowed = {h.strip().lower() for h in pre.headers["access-control-allow-headers"].split(",")}
        assert set(asked) <= allowed
        assert pre.headers["access-control-allow-origin"] == "http://ui.example"


# --------------------------------------------------------------------------- 7. evicted conversations


def test_7_a_conversation_whose_history_was_evicted_says_so(mock, sandbox_image, tmp_path):
    with ServerThread(create_app(settings(mock, tmp_path, max_stored_responses=1))) as srv:
        api = sdk(srv)
        first = api.responses.create(model="m", input="Remember: apple.", conversation="groceries")
        api.responses.create(model="m", input="something else")  # the store keeps one: the conversation's is evicted
        mock.reset()
        with pytest.raises(openai.ConflictError) as e:
            api.responses.create(model="m", input="What did I say?", conversation="groceries")
        assert e.value.code == "conversation_expired" and first.id in e.value.message
        assert e.value.body["param"] == "conversation"
        assert mock.requests() == []  # nothing went to the model without its history
        # a new name starts afresh, as before
        assert api.responses.create(model="m", input="hi", conversation="groceries-2").previous_response_id is None


# --------------------------------------------------------------------------- 8. the OpenAPI document


def test_8_the_openapi_document_matches_the_server(server):
    with client(server) as http:
        doc = http.get("/openapi.json").json()
        paths = doc["paths"]
        for path, item in paths.items():
            for method, op in item.items():
                assert "422" not in op["responses"], (method, path)
        chat = paths["/v1/chat/completions"]["post"]["responses"]
        assert {"200", "400", "401", "413", "429", "502"} <= set(chat)
        assert chat["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
        assert "text/event-stream" in chat["200"]["content"]
        assert "404" in paths["/v1/runs/{run_id}"]["get"]["responses"]
        assert "404" in paths["/v1/responses/{response_id}"]["delete"]["responses"]
        assert "503" in paths["/api/jobs"]["post"]["responses"]
        # what the server answers for bad input is what the document says it answers
        bad = http.post("/v1/chat/completions", json={"messages": []})
        assert bad.status_code == 400
        # the job validators are in the document: a name "0" is a valid name, an empty schedule is not
        job = doc["components"]["schemas"]["JobSpec"]["properties"]
        import re
        schedule = next(s for s in job["schedule"]["anyOf"] if s.get("type") == "string")
        assert not re.search(schedule["pattern"], "") and re.search(schedule["pattern"], "0 3 * * *")
        assert_error(http.post("/api/jobs", json={"name": "j", "prompt": "p", "schedule": ""}), 400, "invalid_request")
        # OPTIONS names every method of the path
        r = http.options("/v1/responses/resp_x")
        assert r.status_code == 405 and set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "DELETE"}


# --------------------------------------------------------------------------- 9. uvicorn's own 400


def test_9_uvicorns_own_400_carries_the_security_headers(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
        raw = b""
        while chunk := s.recv(4096):
            raw += chunk
    head = raw.split(b"\r\n\r\n", 1)[0].decode().lower().split("\r\n")
    assert head[0].startswith("http/1.1 400")
    assert "x-content-type-options: nosniff" in head and "referrer-policy: no-referrer" in head


# --------------------------------------------------------------------------- 10. keep-alive


def test_10_an_idle_connection_outlives_retry_after(one_slot, docker_engine):
    with client(one_slot) as api:
        run_id = api.post("/v1/runs", json={"input": script(terminal(HOLD))}).json()["run_id"]
    conn = http_client_connection(one_slot)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    conn.request("POST", "/v1/chat/completions", body, headers)
    busy = conn.getresponse()
    busy.read()
    assert busy.status == 429
    wait = int(busy.headers["Retry-After"])
    sock = conn.sock
    time.sleep(wait + 0.5)  # the client does as told: waits Retry-After, then retries on its connection
    conn.request("GET", "/v1/models", headers=headers)
    again = conn.getresponse()
    assert again.status == 200 and conn.sock is sock  # the same connection, still open
    again.read()
    conn.close()
    release(docker_engine, **{"hermes-batch.prompt": run_id[4:16]})


def http_client_connection(srv: ServerThread) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    conn.auto_open = 0  # never reconnect behind the test's back: a closed connection must show
    conn.connect()
    return conn


# --------------------------------------------------------------------------- 11. stop ends the command


def test_11_stop_ends_the_running_tool_command(server, mock, docker_engine):
    mock.reset()
    with client(server) as http:
        run_id = http.post("/v1/runs", json={"input": script(terminal(HOLD), terminal("echo never"))}).json()["run_id"]
        names: list[str] = []

        def watch() -> None:
            def on_event(name: str, data: dict) -> None:
                names.append(name)
                if name == "tool.started":  # the command runs, and nobody will release it
                    assert http.post(f"/v1/runs/{run_id}/stop").json()["status"] == "stopping"
            with client(server) as own:
                read_events(own, run_id, on_event=on_event)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        # the stop itself ends the command (commands time out only after 900 s here)
        until(lambda: http.get(f"/v1/runs/{run_id}").json()["status"] == "cancelled", "the run to be cancelled",
              timeout=60)
        watcher.join(timeout=60)
    assert names == ["run.started", "tool.started", "run.stopping", "tool.completed", "run.cancelled"]
    assert len(mock.requests()) == 1
    assert api_containers(docker_engine, **{"hermes-batch.prompt": run_id[4:16]}) == []


# --------------------------------------------------------------------------- API_SERVER_SANDBOX=local


def test_serve_with_the_local_sandbox_runs_commands_on_this_host(mock, tmp_path, docker_engine):
    """`hermes-batch serve` from the outside with API_SERVER_SANDBOX=local: it says so loudly,
    and a tool call's command runs on this host (it writes a file here), in no container."""
    port = free_port()
    env = {**os.environ, "API_SERVER_SANDBOX": "local", "API_SERVER_KEY": KEY, "API_SERVER_PORT": str(port),
           "HERMES_HOME": str(tmp_path), "HERMES_BASE_URL": mock.base_url, "HERMES_MODEL": "mock-upstream"}
    env.pop("PREFECT_API_URL", None)
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--no-jobs", "--log-level", "warning"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def up() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        until(up, "hermes-batch serve to answer", timeout=120)
        marker = tmp_path / "written-by-the-agent"
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
        answer = api.chat.completions.create(model="m", messages=[{"role": "user", "content": script(
            terminal(f"echo on-the-host > {marker}"), {"content": "written"})}])
        assert answer.choices[0].message.content == "written"
        assert marker.read_text() == "on-the-host\n"
        detailed = httpx.get(f"http://127.0.0.1:{port}/health/detailed", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert detailed["readiness"]["checks"]["sandbox"] == {"status": "ok", "backend": "local"}
        assert api_containers(docker_engine, **{"hermes-batch.run": f"api-{socket.gethostname()}-{proc.pid}"}) == []
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    assert "WARNING: API_SERVER_SANDBOX=local: model-written commands run on THIS host" in log.read_text()
