"""The API server for real: uvicorn on a loopback port, driven by the openai SDK and httpx,
the bundled scripted model server upstream, tool calls in real Docker sandboxes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest

from hermes.agent.loop import DEFAULT_SYSTEM_PROMPT
from hermes.api import ApiSettings, create_app
from hermes.api.server import ServerThread
from hermes.api.service import API_LABEL
from mockllm import MockLLM
from tests.helpers import script, until

KEY = "test-key-7c1e"
JSON = {"Content-Type": "application/json"}
SECURITY = {"x-content-type-options": "nosniff", "referrer-policy": "no-referrer"}
pytestmark = pytest.mark.docker


def terminal(command: str) -> dict:
    return {"tool_calls": [{"name": "terminal", "arguments": {"command": command}}]}


#: a command that runs until the test lets it finish (by creating /tmp/release in its sandbox)
HOLD = "while [ ! -f /tmp/release ]; do sleep 0.1; done; echo released"


def api_containers(docker_engine, **labels: str) -> list:
    filters = [API_LABEL] + [f"{k}={v}" for k, v in labels.items()]
    # sparse: no inspect per container, so one being removed meanwhile cannot fail the listing
    return docker_engine.containers.list(all=True, sparse=True, filters={"label": filters})


def release(docker_engine, **labels: str) -> None:
    """Let a HOLD command finish: create /tmp/release in its (running) sandbox."""
    box = until(lambda: [c for c in api_containers(docker_engine, **labels) if c.status == "running"],
                "the sandbox to run")
    result = box[0].exec_run("touch /tmp/release", user="65534:65534")
    assert result.exit_code == 0, result.output


def settings(mock: MockLLM, tmp: Path, **kw: Any) -> ApiSettings:
    base = dict(key=KEY, upstream_base_url=mock.base_url, upstream_model="mock-upstream",
                store_path=tmp / "responses.sqlite3")
    return ApiSettings(**{**base, **kw})


def upstream_messages(mock: MockLLM) -> list[list[dict]]:
    return [body["messages"] for body in mock.requests()]


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"])
    assert body["error"]["message"]
    if code:
        assert body["error"]["code"] == code, body
    for name, value in SECURITY.items():
        assert response.headers.get(name) == value
    return body["error"]


@pytest.fixture(scope="module")
def mock():
    with MockLLM() as server:
        yield server


@pytest.fixture(scope="module")
def server(mock, sandbox_image, tmp_path_factory, docker_engine) -> Iterator[ServerThread]:
    with ServerThread(create_app(settings(mock, tmp_path_factory.mktemp("api")))) as srv:
        yield srv
    # every request's sandbox is gone with it; none outlives the server
    assert api_containers(docker_engine, **{"hermes-batch.run": srv.server.config.app.state.service.label}) == []


@pytest.fixture
def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)


@pytest.fixture
def http(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as client:
        yield client


# --------------------------------------------------------------------------- chat completions


def test_sdk_holds_a_multi_turn_tool_using_conversation(sdk, mock, docker_engine, server):
    mock.reset()
    history = [{"role": "system", "content": "Answer tersely."},
               {"role": "user", "content": "Leave a note and read it back."}]
    first = sdk.chat.completions.create(model="hermes-agent", messages=history)
    answer = first.choices[0].message.content
    # the mock's default scenario: write_file + terminal, then read_file, then a summary of what it saw
    assert answer.startswith("Done. hostname=") and "token" in answer
    assert first.object == "chat.completion" and first.model == "hermes-agent"
    assert first.choices[0].finish_reason == "stop"
    assert first.usage.total_tokens > 0 and first.usage.prompt_tokens > 0
    sent = upstream_messages(mock)
    assert len(sent) == 3
    system = sent[0][0]
    assert system["role"] == "system" and DEFAULT_SYSTEM_PROMPT in system["content"]
    assert system["content"].endswith("Answer tersely.")  # the client's system message, layered on top
    tools = {t["function"]["name"] for t in mock.requests()[0]["tools"]}
    assert {"terminal", "read_file", "write_file"} <= tools

    mock.reset()
    history += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Do it once more."}]
    chunks = list(sdk.chat.completions.create(model="hermes-agent", messages=history, stream=True,
                                              stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("Done. hostname=")
    # each request has a sandbox of its own: another container, another hostname
    assert text.split(";")[0] != answer.split(";")[0]
    progress = [c for c in chunks if c.object == "hermes.tool.progress"]
    seen = [(p.tool, p.status) for p in progress]
    # the first turn's two calls run in parallel: each starts before it completes, in any interleaving
    assert sorted(seen[:4]) == sorted([("write_file", "started"), ("write_file", "completed"),
                                       ("terminal", "started"), ("terminal", "completed")])
    assert all(seen.index((t, "started")) < seen.index((t, "completed")) for t in ("write_file", "terminal"))
    assert seen[4:] == [("read_file", "started"), ("read_file", "completed")]
    assert all(p.ok for p in progress if p.status == "completed")
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage.total_tokens > 0
    # the upstream saw the whole conversation the client sent
    assert [m["role"] for m in upstream_messages(mock)[0]] == ["system", "user", "assistant", "user"]
    assert until(lambda: not api_containers(docker_engine, **{"hermes-batch.run": server.server.config.app.state.service.label}),
                 "the request's sandbox to be removed")


def test_streamed_chat_is_sse_with_tool_progress_events(http, mock):
    body = {"model": "hermes-agent", "stream": True,
            "messages": [{"role": "user", "content": script(terminal("echo hi"), {"content": "all done"})}]}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-content-type-options"] == "nosniff"
        lines = [line for line in r.iter_lines() if line]
    events = [line.split(": ", 1)[1] for line in lines if line.startswith("event: ")]
    assert events == ["hermes.tool.progress", "hermes.tool.progress"]
    data = [line[6:] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "all done"


def test_image_parts_pass_through_and_files_are_refused(sdk, http, mock):
    mock.reset()
    png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    parts = [{"type": "text", "text": "What is in these images? " + script({"content": "Two images: a cat and a dot."})},
             {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "high"}},
             {"type": "image_url", "image_url": {"url": png}}]
    reply = sdk.chat.completions.create(model="hermes-agent", messages=[{"role": "user", "content": parts}])
    assert reply.choices[0].message.content == "Two images: a cat and a dot."
    assert mock.requests()[0]["messages"][1]["content"] == parts  # given to the model as they came

    refused = [
        {"type": "file", "file": {"file_id": "file-123"}},
        {"type": "input_file", "file_data": "..."},
        {"type": "image_url", "image_url": {"url": "data:application/pdf;base64,JVBERi0x"}},
        {"type": "image_url", "image_url": {"file_id": "file-1", "url": "https://x/y.png"}},
    ]
    for part in refused:
        r = http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": [part]}]})
        err = assert_error(r, 400, "unsupported_content_type")
        assert err["param"].startswith("messages[0].content[0]")
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": [refused[2]]}])
    assert e.value.code == "unsupported_content_type"


def test_a_failing_upstream_is_a_502_or_an_in_band_error(mock, sandbox_image, tmp_path):
    broken = script({"error": 500})
    with ServerThread(create_app(settings(mock, tmp_path, upstream_max_retries=0))) as srv:
        sdk = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)
        for call in (lambda: sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": broken}]),
                     lambda: sdk.responses.create(model="m", input=broken)):
            with pytest.raises(openai.APIStatusError) as e:
                call()
            assert e.value.status_code == 502 and e.value.code == "upstream_error"
        with pytest.raises(openai.APIError, match="upstream model failed"):  # headers were sent: the error comes in-band
            list(sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": broken}], stream=True))
        events = list(sdk.responses.create(model="m", input=broken, stream=True))
        assert events[-1].type == "response.failed" and events[-1].response.status == "failed"


def test_a_client_leaving_a_stream_stops_its_agent(http, mock, docker_engine, server):
    mock.reset()
    body = {"model": "m", "stream": True,
            "messages": [{"role": "user", "content": script(terminal(HOLD), terminal("echo never"))}]}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("event: hermes.tool.progress"):
                break  # the tool has started: hang up
    label = server.server.config.app.state.service.label
    # the stop ends the running command too: nobody releases it
    until(lambda: http.get("/health/detailed").json()["agent_runs"]["active"] == 0, "the agent to stop")
    until(lambda: not api_containers(docker_engine, **{"hermes-batch.run": label}), "the sandbox to be removed")
    assert len(mock.requests()) == 1  # no model call after the client left


# --------------------------------------------------------------------------- responses


def test_responses_items_store_and_previous_response_id(sdk, http, mock):
    mock.reset()
    first = sdk.responses.create(model="hermes-agent", instructions="Be brief.",
                                 input=script(terminal("echo 42 > answer.txt && cat answer.txt"), {"content": "It is 42."}))
    assert first.status == "completed" and first.object == "response"
    assert [o.type for o in first.output] == ["function_call", "function_call_output", "message"]
    call, result, message = first.output
    assert call.name == "terminal" and json.loads(call.arguments)["command"].startswith("echo 42")
    assert result.call_id == call.call_id and "42" in result.output
    assert first.output_text == "It is 42."
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens > 0
    system = mock.requests()[0]["messages"][0]["content"]
    assert DEFAULT_SYSTEM_PROMPT in system and system.endswith("Be brief.")

    mock.reset()
    second = sdk.responses.create(model="hermes-agent", input="And doubled?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    sent = mock.requests()[0]["messages"]
    # the stored history, tool call and tool result included, came back to the model
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert sent[2]["tool_calls"][0]["id"] == call.call_id and "42" in sent[3]["content"]
    assert "Be brief." not in sent[0]["content"]  # instructions are per request

    fetched = http.get(f"/v1/responses/{first.id}").json()
    assert fetched["id"] == first.id and fetched["output"][2]["content"][0]["text"] == "It is 42."
    assert http.delete(f"/v1/responses/{first.id}").json() == {"id": first.id, "object": "response", "deleted": True}
    assert_error(http.get(f"/v1/responses/{first.id}"), 404, "not_found")
    assert_error(http.delete(f"/v1/responses/{first.id}"), 404, "not_found")
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model="m", input="x", previous_response_id=first.id)

    unstored = sdk.responses.create(model="m", input="not kept", store=False)
    assert_error(http.get(f"/v1/responses/{unstored.id}"), 404)


def test_streamed_responses_carry_the_responses_event_types(sdk, mock):
    events = list(sdk.responses.create(model="hermes-agent", stream=True,
                                       input=script({"content": "Looking.", **terminal("echo streamed")},
                                                    {"content": "Saw it."})))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    for kind in ("response.output_item.added", "response.output_text.delta", "response.output_item.done",
                 "response.content_part.added", "response.output_text.done"):
        assert kind in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done] == ["message", "function_call", "function_call_output", "message"]
    final = events[-1].response
    assert final.status == "completed" and [o.type for o in final.output] == [i.type for i in done]
    assert final.output_text == "Looking.Saw it."
    # the SDK's own stream helper accumulates the same events into the same response
    with sdk.responses.stream(model="hermes-agent", input=script({"content": "Accumulated by the helper."})) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        assert text == stream.get_final_response().output_text == "Accumulated by the helper."


def test_named_conversations_and_chains_survive_a_restart(mock, sandbox_image, tmp_path):
    store = tmp_path / "kept"
    with ServerThread(create_app(settings(mock, store))) as srv:
        sdk = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)
        first = sdk.responses.create(model="m", input=script(terminal("echo apple"), {"content": "Noted: apple."}),
                                     conversation="groceries")
        assert first.conversation.id == "groceries" and first.previous_response_id is None
    mock.reset()
    with ServerThread(create_app(settings(mock, store))) as srv:
        sdk = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)
        second = sdk.responses.create(model="m", input="What did I note?", conversation="groceries")
        assert second.previous_response_id == first.id  # the conversation found its latest response
        assert "echo apple" in json.dumps(mock.requests()[0]["messages"])
        third = sdk.responses.create(model="m", input="And before?", previous_response_id=first.id)
        assert third.previous_response_id == first.id
        fourth = sdk.responses.create(model="m", input="again", conversation={"id": "groceries"})
        assert fourth.previous_response_id == second.id
        r = httpx.post(f"{srv.url}/v1/responses", headers={"Authorization": f"Bearer {KEY}"},
                       json={"input": "x", "conversation": "groceries", "previous_response_id": first.id})
        assert assert_error(r, 400)["param"] == "conversation"


def test_stored_responses_are_capped_least_recently_used_first(mock, sandbox_image, tmp_path):
    with ServerThread(create_app(settings(mock, tmp_path, max_stored_responses=2))) as srv:
        sdk = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)
        a, b = (sdk.responses.create(model="m", input=f"r{i}") for i in range(2))
        sdk.responses.retrieve(a.id)  # a is now more recently used than b
        c = sdk.responses.create(model="m", input="r2")
        assert sdk.responses.retrieve(a.id).id == a.id and sdk.responses.retrieve(c.id).id == c.id
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(b.id)


# --------------------------------------------------------------------------- runs


def read_events(http: httpx.Client, run_id: str, headers: dict | None = None, on_event=None) -> list[tuple[str, dict]]:
    events: list[tuple[str, dict]] = []
    name = None
    with http.stream("GET", f"/v1/runs/{run_id}/events", headers=headers or {}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[6:])))
                if on_event:
                    on_event(name, events[-1][1])
    return events


def test_runs_report_events_to_late_and_resuming_subscribers(http, mock):
    r = http.post("/v1/runs", json={"input": script(terminal("echo run"), {"content": "Run done."}),
                                    "session_id": "space-session", "instructions": "Be quick."})
    assert r.status_code == 202
    started = r.json()
    assert started["status"] == "started" and started["run_id"].startswith("run_")
    run_id = started["run_id"]
    status = until(lambda: (s := http.get(f"/v1/runs/{run_id}").json())["status"] == "completed" and s, "the run")
    assert status["object"] == "hermes.run" and status["session_id"] == "space-session"
    assert status["output"] == "Run done." and status["usage"]["total_tokens"] > 0 and status["model"] == "hermes-agent"
    # attached only now: the whole buffered story
    events = read_events(http, run_id)
    names = [n for n, _ in events]
    assert names[0] == "run.started" and names[-1] == "run.completed"
    assert names.index("tool.started") < names.index("tool.completed")
    assert "".join(d["delta"] for n, d in events if n == "message.delta") == "Run done."
    # reconnecting with Last-Event-ID continues after it
    again = read_events(http, run_id, headers={"Last-Event-ID": "1"})
    assert again == events[2:]


# stopping a run (and the command it runs): tests/api/test_api_clients.py::test_11_stop_ends_the_running_tool_command


# --------------------------------------------------------------------------- limits and idempotency


@pytest.fixture
def small(mock, sandbox_image, tmp_path) -> Iterator[ServerThread]:
    """A server with tight limits: one agent run at a time, small bodies, short event buffers."""
    with ServerThread(create_app(settings(mock, tmp_path, max_concurrent_runs=1, max_request_bytes=4096,
                                          run_events_ttl=0.5, retry_after=7))) as srv:
        yield srv


def test_a_full_server_answers_429_with_retry_after(small, docker_engine):
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=small.url, headers=auth, timeout=120) as http:
        run_id = http.post("/v1/runs", json={"input": script(terminal(HOLD))}).json()["run_id"]
        busy = http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert_error(busy, 429, "too_many_runs")
        assert busy.headers["retry-after"] == "7"
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=small.base_url, api_key=KEY, max_retries=0).responses.create(model="m", input="hi")
        assert_error(http.post("/v1/runs", json={"input": "hi"}), 429)
        # once the run is over (stopped: its command is ended with it) the slot is free again
        http.post(f"/v1/runs/{run_id}/stop")
        until(lambda: http.get(f"/v1/runs/{run_id}").json()["status"] == "cancelled", "the cancellation")
        assert http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}).status_code == 200


def test_unread_run_events_expire_but_the_run_stays_known(small):
    with httpx.Client(base_url=small.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as http:
        run_id = http.post("/v1/runs", json={"input": "quick"}).json()["run_id"]
        until(lambda: http.get(f"/v1/runs/{run_id}").json()["status"] == "completed", "the run")
        until(lambda: http.get(f"/v1/runs/{run_id}").json()["events_buffered"] == 0, "the unread buffer to expire")
        # a client attaching now learns where the run stands
        events = read_events(http, run_id)
        assert [n for n, _ in events] == ["run.status"] and events[0][1]["status"] == "completed"
        assert events[0][1]["output"].startswith("Done.")


def test_idempotency_key_replays_and_refuses_a_different_body(small, mock):
    body = {"model": "m", "messages": [{"role": "user", "content": script({"content": "counted once"})}]}
    with httpx.Client(base_url=small.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as http:
        mock.reset()
        first = http.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "k-1"})
        again = http.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "k-1"})
        assert first.status_code == again.status_code == 200
        assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
        assert again.headers["x-content-type-options"] == "nosniff"
        assert len(mock.requests()) == 1  # answered once, not recomputed
        other = http.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "other"}]},
                          headers={"Idempotency-Key": "k-1"})
        assert_error(other, 409, "idempotency_key_reused")
        assert len(mock.requests()) == 1
    sdk = openai.OpenAI(base_url=small.base_url, api_key=KEY, max_retries=0)
    a = sdk.responses.create(model="m", input="once", extra_headers={"Idempotency-Key": "k-2"})
    b = sdk.responses.create(model="m", input="once", extra_headers={"Idempotency-Key": "k-2"})
    assert a.id == b.id


def test_request_size_limit(small):
    with httpx.Client(base_url=small.url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
        assert_error(http.post("/v1/chat/completions", json=big), 413, "request_too_large")

        def chunked():  # no Content-Length: counted as it arrives
            yield json.dumps(big).encode()
        assert_error(http.post("/v1/chat/completions", content=chunked(),
                               headers={"Content-Type": "application/json"}), 413, "request_too_large")


# --------------------------------------------------------------------------- auth, CORS, headers


def test_bearer_key_is_required_except_for_liveness(server, http):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
                    {"Authorization": f"Bearer {KEY}x"}):
        r = httpx.post(f"{server.url}/v1/chat/completions", content=b"{not json", headers=headers)
        assert_error(r, 401, "invalid_api_key")  # not 400: nothing is revealed to a stranger
        assert r.headers["www-authenticate"] == "Bearer"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url, api_key="wrong", max_retries=0).models.list()
    for path in ("/health", "/v1/health"):
        r = httpx.get(server.url + path)
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        assert r.headers["referrer-policy"] == "no-referrer"
    assert_error(httpx.get(server.url + "/health/detailed"), 401)
    detailed = http.get("/health/detailed")
    assert detailed.status_code == 200
    body = detailed.json()
    assert body["status"] == "ok" and body["readiness"]["checks"]["sandbox"]["status"] == "ok"
    assert body["readiness"]["checks"]["jobs"]["status"] == "disabled"
    assert body["agent_runs"] == {"active": 0, "stopping": 0, "limit": 4} and "completed" in body["runs"]
    text = detailed.text
    assert KEY not in text and "sqlite3" not in text and "/tmp" not in text and "127.0.0.1" not in text


def test_models_and_capabilities(sdk, http):
    assert [m.id for m in sdk.models.list()] == ["hermes-agent"]
    assert sdk.models.retrieve("hermes-agent").id == "hermes-agent"
    caps = http.get("/v1/capabilities").json()
    assert caps["object"] == "hermes.api_server.capabilities" and caps["platform"] == "hermes-agent"
    assert caps["model"] == "hermes-agent" and caps["auth"] == {"type": "bearer", "required": True}
    for feature in ("chat_completions", "responses_api", "run_submission", "run_status", "run_events_sse", "run_stop"):
        assert caps["features"][feature] is True
    assert caps["features"]["jobs"] is False


def test_cors_is_off_without_an_allowlist(server):
    r = httpx.options(f"{server.url}/v1/chat/completions",
                      headers={"Origin": "http://ui.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers
    assert_error(r, 401)


def test_cors_allowlist_preflight_and_streams(mock, sandbox_image, tmp_path):
    with ServerThread(create_app(settings(mock, tmp_path, cors_origins="http://ui.example"))) as srv:
        pre = httpx.options(f"{srv.url}/v1/chat/completions", headers={
            "Origin": "http://ui.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, idempotency-key"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://ui.example"
        assert pre.headers["access-control-max-age"] == "600"
        assert "idempotency-key" in pre.headers["access-control-allow-headers"].lower()
        assert pre.headers["x-content-type-options"] == "nosniff"
        refused = httpx.options(f"{srv.url}/v1/chat/completions",
                                headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
        assert_error(refused, 400, "cors_refused")
        assert "access-control-allow-origin" not in refused.headers
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=body,
                          headers={"Origin": "http://ui.example", "Authorization": f"Bearer {KEY}"}) as r:
            assert r.headers["access-control-allow-origin"] == "http://ui.example"
            assert r.headers["content-type"].startswith("text/event-stream")
            assert list(r.iter_lines())[-2] == "data: [DONE]"
        # errors reach browsers too
        r = httpx.get(f"{srv.url}/v1/models", headers={"Origin": "http://ui.example"})
        assert_error(r, 401)
        assert r.headers["access-control-allow-origin"] == "http://ui.example"


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("method, path, kwargs, status, code, param", [
    ("POST", "/v1/chat/completions", {"content": b"{\"model\": \"m\", \"messages\": [", "headers": JSON}, 400, "invalid_json", None),
    ("POST", "/v1/chat/completions", {"content": b"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}"}, 400, "invalid_request", None),
    ("POST", "/v1/chat/completions", {"json": ["not", "an", "object"]}, 400, "invalid_request", None),
    ("POST", "/v1/chat/completions", {"json": {"model": "m"}}, 400, "invalid_request", "messages"),
    ("POST", "/v1/chat/completions", {"json": {"model": "m", "messages": "hi"}}, 400, "invalid_request", "messages"),
    ("POST", "/v1/chat/completions", {"json": {"model": "m", "messages": []}}, 400, "invalid_request", "messages"),
    ("POST", "/v1/chat/completions", {"json": {"messages": [{"role": "wizard", "content": "x"}]}}, 400, "invalid_request", "messages[0].role"),
    ("POST", "/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": 5}]}}, 400, "invalid_request", "messages[0].content"),
    ("POST", "/v1/chat/completions", {"json": {"messages": [{"role": "system", "content": "only me"}]}}, 400, "invalid_request", "messages"),
    ("POST", "/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "x"}], "stream": [1]}}, 400, "invalid_request", "stream"),
    ("POST", "/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}]}]}}, 400, "invalid_request", None),
    ("POST", "/v1/responses", {"json": {"model": "m"}}, 400, "invalid_request", "input"),
    ("POST", "/v1/responses", {"json": {"input": 42}}, 400, "invalid_request", "input"),
    ("POST", "/v1/responses", {"json": {"input": "x", "conversation": 5}}, 400, "invalid_request", "conversation"),
    ("POST", "/v1/responses", {"json": {"input": [{"type": "input_file", "file_id": "f"}]}}, 400, "unsupported_content_type", None),
    ("POST", "/v1/responses", {"json": {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}}, 400, "unsupported_content_type", None),
    ("POST", "/v1/responses", {"json": {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:text/plain;base64,aGk="}]}]}}, 400, "unsupported_content_type", None),
    ("POST", "/v1/responses", {"json": {"input": "x", "previous_response_id": "resp_nope"}}, 404, "not_found", "previous_response_id"),
    ("POST", "/v1/responses", {"json": {"input": "x", "previous_response_id": "resp_a", "conversation": "c"}}, 400, "invalid_request", "conversation"),
    ("POST", "/v1/responses", {"json": {"input": "x", "store": "maybe"}}, 400, "invalid_request", "store"),
    ("GET", "/v1/responses/resp_nope", {}, 404, "not_found", None),
    ("DELETE", "/v1/responses/resp_nope", {}, 404, "not_found", None),
    ("GET", "/v1/runs/run_nope", {}, 404, "not_found", None),
    ("GET", "/v1/runs/run_nope/events", {}, 404, "not_found", None),
    ("POST", "/v1/runs/run_nope/stop", {}, 404, "not_found", None),
    ("POST", "/v1/runs", {"json": {"session_id": "s"}}, 400, "invalid_request", "input"),
    ("POST", "/v1/runs", {"json": {"input": "x", "previous_response_id": "resp_nope"}}, 404, "not_found", "previous_response_id"),
    ("GET", "/v1/models/gpt-4", {}, 404, "not_found", "model"),
    ("GET", "/api/jobs", {}, 503, "jobs_unavailable", None),
    ("POST", "/api/jobs", {"json": {"name": "j", "prompt": "p"}}, 503, "jobs_unavailable", None),
    ("GET", "/v1/nowhere", {}, 404, "not_found", None),
    ("PUT", "/v1/chat/completions", {"json": {}}, 405, "method_not_allowed", None),
    ("POST", "/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "x"}]}, "headers": {"Idempotency-Key": "x" * 300}}, 400, "invalid_idempotency_key", None),
])
def test_bad_input_gets_the_right_status_and_an_openai_error_body(http, method, path, kwargs, status, code, param):
    r = http.request(method, path, **kwargs)
    err = assert_error(r, status, code)
    if param:
        assert err["param"] == param
    expected_type = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
                     503: "server_error"}[status]
    assert err["type"] == expected_type


def test_refuses_to_start_exposed_without_a_key(mock, tmp_path, capsys, monkeypatch):
    from flows.serve import main
    from hermes.api.server_settings import UnsafeBind

    monkeypatch.delenv("API_SERVER_KEY", raising=False)
    assert main(["--host", "0.0.0.0", "--port", "0", "--no-jobs"]) == 2
    assert "without API_SERVER_KEY" in capsys.readouterr().err
    with pytest.raises(UnsafeBind):
        create_app(ApiSettings(host="0.0.0.0", store_path=tmp_path / "r.db"))
    # with a key it may: the app serves, and asks that key of every client
    keyed = create_app(ApiSettings(host="0.0.0.0", key="k", store_path=tmp_path / "r.db", sandbox="local"))
    with ServerThread(keyed) as srv:
        assert httpx.get(f"{srv.url}/v1/models").status_code == 401
        assert httpx.get(f"{srv.url}/v1/models", headers={"Authorization": "Bearer k"}).json()["data"][0]["id"] == "hermes-agent"


def test_settings_come_from_the_environment_over_the_config_file(tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text("gateway:\n  api_server:\n    port: 9000\n    host: 127.0.0.2\n    model_name: from-file\n"
                      "    cors_origins: http://a.example, http://b.example\n    model: upstream-from-file\n")
    monkeypatch.setenv("API_SERVER_MODEL_NAME", "from-env")
    monkeypatch.setenv("HERMES_BASE_URL", "http://127.0.0.1:1/v1")
    s = ApiSettings.load(config)
    assert (s.port, s.host, s.model_name) == (9000, "127.0.0.2", "from-env")
    assert s.cors_origins == ["http://a.example", "http://b.example"]
    assert (s.upstream_model, s.upstream_base_url) == ("upstream-from-file", "http://127.0.0.1:1/v1")
    assert ApiSettings.load(config, port=1234).port == 1234


def test_idle_connections_are_kept_api_server_keep_alive_seconds_and_longer_than_retry_after(mock, tmp_path, monkeypatch):
    import socket
    import time

    monkeypatch.setenv("API_SERVER_KEEP_ALIVE", "7")
    kept = settings(mock, tmp_path, retry_after=1)
    assert kept.keep_alive == 7 and kept.keep_alive_seconds() == 7
    assert settings(mock, tmp_path, retry_after=5, keep_alive=1).keep_alive_seconds() == 10  # Retry-After + 5

    def health(sock: socket.socket) -> bytes:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        while b'"ok"' not in answer:
            chunk = sock.recv(4096)
            assert chunk, f"the server closed the connection: {answer!r}"
            answer += chunk
        return answer

    with ServerThread(create_app(kept)) as srv, socket.create_connection(("127.0.0.1", srv.port), timeout=60) as sock:
        assert health(sock).startswith(b"HTTP/1.1 200")
        time.sleep(3)  # idle, well inside the 7 s: what is tested is that the connection outlives it
        assert health(sock).startswith(b"HTTP/1.1 200")
        idle_since = time.monotonic()
        assert sock.recv(4096) == b""  # then the server closes it, not before the keep-alive has passed
        assert time.monotonic() - idle_since >= 6
