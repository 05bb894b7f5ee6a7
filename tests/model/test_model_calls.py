"""The run's chat completion calls (hermes.model.calls) keep what the openai SDK's call did:
which answers are retried and how often, Retry-After, time-outs, dropped connections, the
error messages, the headers and the body on the wire.

Each scenario is a real HTTP server on loopback that answers a scripted list of statuses and
notes each request; the same scenario is put to the official openai SDK (`client.post`, as
ModelClient called it before) and to ModelClient, and both must make the same number of
attempts and end with the same message.
"""
from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import openai
import pytest

from hermes.model.client import ModelClient, ModelError, _error_text
from hermes.settings import AgentSettings

ANSWER = {"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
          "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hello"}}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


class Scripted:
    """Answers each POST with the next (status, headers, body) of its script, the last one for ever;
    a status of None accepts the request and never answers."""

    def __init__(self, script: list[tuple[int | None, dict[str, str], bytes]]):
        self.script = list(script)
        self.seen: list[dict] = []
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                me.seen.append({"at": time.monotonic(), "path": self.path, "headers": dict(self.headers),
                                "body": json.loads(body)})
                status, headers, payload = me.script.pop(0) if len(me.script) > 1 else me.script[0]
                if status is None:
                    time.sleep(3)
                    return
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def ok() -> tuple[int, dict, bytes]:
    return 200, {}, json.dumps(ANSWER).encode()


def error(status: int, message: str | None = "slow down", headers: dict | None = None) -> tuple[int, dict, bytes]:
    body = {"error": {"message": message, "type": "x"}} if message else {"detail": "no message here"}
    return status, headers or {}, json.dumps(body).encode()


def through_ours(script, *, max_retries: int, timeout: float = 30.0):
    server = Scripted(script)
    client = ModelClient(AgentSettings(model="m", base_url=server.base_url, max_tokens=7,
                                       providers_order=["a"]), "sk-ours", max_retries=max_retries, timeout=timeout)
    try:
        try:
            outcome = client.complete([{"role": "user", "content": "hi", "reasoning": "kept back"}], [])
        except ModelError as e:
            outcome = e
        return outcome, server.seen
    finally:
        client.close()
        server.close()


def through_sdk(script, *, max_retries: int, timeout: float = 30.0):
    server = Scripted(script)
    try:
        with openai.OpenAI(base_url=server.base_url, api_key="sk-sdk", max_retries=max_retries, timeout=timeout) as sdk:
            try:
                import httpx
                outcome = sdk.post("/chat/completions", body={"model": "m", "messages": []}, cast_to=httpx.Response)
            except openai.APIStatusError as e:
                outcome = f"model endpoint answered {e.status_code}: {_error_text(e)}"
            except openai.APIError as e:
                outcome = f"model endpoint failed: {e}"
        return outcome, server.seen
    finally:
        server.close()


SCENARIOS = {
    "429 then 503 then an answer": ([error(429, headers={"Retry-After": "0.3"}), error(503), ok()], 2),
    "400 is not retried": ([error(400, "bad request: messages[0]"), ok()], 3),
    "500 until the retries run out": ([error(500, "overloaded")], 2),
    "x-should-retry false on a 500": ([error(500, headers={"x-should-retry": "false"}), ok()], 3),
    "x-should-retry true on a 400": ([error(400, headers={"x-should-retry": "true"}), ok()], 3),
    "an error without a message": ([error(422, None)], 1),
    "408 and 409 are retried": ([error(408), error(409), ok()], 2),
    "a Retry-After of five minutes is not waited for": ([error(429, headers={"Retry-After": "300"}), ok()], 2),
    "an error body that is not JSON": ([(503, {"Content-Type": "text/plain"}, b"upstream down")], 0),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_same_attempts_and_the_same_message_as_the_sdk(name):
    script, retries = SCENARIOS[name]
    ours, ours_seen = through_ours(script, max_retries=retries)
    sdk, sdk_seen = through_sdk(script, max_retries=retries)
    assert len(ours_seen) == len(sdk_seen), (name, len(ours_seen), len(sdk_seen))
    if isinstance(sdk, str):
        assert isinstance(ours, ModelError) and str(ours) == sdk, (ours, sdk)
    else:
        assert not isinstance(ours, Exception), ours
        assert ours.message["content"] == "hello" and ours.usage["total_tokens"] == 4
    if name.startswith("429"):  # the answer's Retry-After was waited out before the next attempt
        assert ours_seen[1]["at"] - ours_seen[0]["at"] >= 0.3 - 0.01


def test_the_wire_carries_the_key_the_body_and_no_reasoning():
    answer, seen = through_ours([ok()], max_retries=0)
    assert answer.message["content"] == "hello"
    (request,) = seen
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer sk-ours"
    assert request["headers"]["Content-Type"] == "application/json"
    # the extra body is merged at the top level, and reasoning kept for the trajectory is not sent back
    assert request["body"] == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7,
                               "provider": {"order": ["a"]}}


def test_a_body_the_fast_encoder_refuses_still_goes_out_whole():
    """Integers past 64 bits (a dataset's metadata echoed into a tool result, a model's own
    arguments): orjson refuses them, the request must not fail for it."""
    server = Scripted([ok()])
    client = ModelClient(AgentSettings(model="m", base_url=server.base_url), "sk-ours", max_retries=0)
    try:
        messages = [{"role": "user", "content": "hi", "n": 2 ** 70}, {"role": "assistant", "content": "é ✓"}]
        assert client.complete(messages, []).message["content"] == "hello"
    finally:
        client.close()
        server.close()
    (request,) = server.seen
    assert request["body"]["messages"] == messages


def test_an_answer_that_is_not_json_is_a_model_error():
    outcome, seen = through_ours([(200, {"Content-Type": "text/html"}, b"<html>gateway</html>")], max_retries=3)
    assert isinstance(outcome, ModelError) and len(seen) == 1
    assert str(outcome).startswith("model endpoint answered something that is not JSON")


def test_a_silent_endpoint_times_out_and_is_retried_like_the_sdk():
    ours, ours_seen = through_ours([(None, {}, b"")], max_retries=1, timeout=0.5)
    sdk, sdk_seen = through_sdk([(None, {}, b"")], max_retries=1, timeout=0.5)
    assert len(ours_seen) == len(sdk_seen) == 2
    assert sdk == "model endpoint failed: Request timed out."
    # ours says the same, and which setting bounded the wait (tests/model/test_request_timeout.py)
    assert isinstance(ours, ModelError) and str(ours) == sdk + " No answer within --request_timeout 0.5 s."


def test_a_refused_connection_is_retried_then_reported_like_the_sdk():
    with socket.socket() as s:  # a loopback port with nothing listening on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    client = ModelClient(AgentSettings(model="m", base_url=url), "k", max_retries=1)
    try:
        with pytest.raises(ModelError) as ours:
            client.complete([{"role": "user", "content": "hi"}], [])
    finally:
        client.close()
    with openai.OpenAI(base_url=url, api_key="k", max_retries=1) as sdk, pytest.raises(openai.APIConnectionError) as e:
        sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert str(ours.value) == f"model endpoint failed: {e.value}" == "model endpoint failed: Connection error."
    assert client.limiter.snapshot()["in_flight"] == 0 and client.limiter.snapshot()["requests"] == 2
