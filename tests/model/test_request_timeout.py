"""--request_timeout (AgentSettings.request_timeout): how long one model request waits for its answer.

A real HTTP server on loopback that takes its time before it answers; the settings come from the
command line as `hermes-batch run` parses it, and the real ModelClient sends the request. A server
slower than the setting fails the request with a time-out that names the setting (the fix is to
raise it: llama.cpp on a CPU reading its first long prompt); a setting above the server's time passes.
Retries and the breaker see a time-out as they did before the setting existed.
"""
from __future__ import annotations

import json
import time

import pytest
from pydantic import ValidationError

from flows.run_command import run_parser, settings_from_args
from hermes.model.calls import TIMED_OUT
from hermes.model.client import ModelClient, ModelError
from hermes.settings import AgentSettings
from tests.wire_server import Raw, WireServer

ANSWER = {"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
          "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hello"}}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
#: how long the server thinks before it answers; the small setting below is a fifth of it
SERVER_SECONDS = 1.0


class Slow:
    """A chat completions endpoint (tests/wire_server.py) that sleeps SERVER_SECONDS before each answer
    (plain or streamed)."""

    def __init__(self) -> None:
        self.requests = 0
        self.wire = WireServer(self.answer).__enter__()
        self.base_url = self.wire.base_url

    def answer(self, method: str, path: str, body: dict) -> tuple[int, object]:
        self.requests += 1
        time.sleep(SERVER_SECONDS)
        if body.get("stream"):
            chunk = {**ANSWER, "object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}
            return 200, Raw(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
        return 200, ANSWER

    def close(self) -> None:
        self.wire.__exit__(None, None, None)


@pytest.fixture
def slow():
    server = Slow()
    yield server
    server.close()


def from_command_line(*flags: str):
    """The settings `hermes-batch run ... FLAGS` makes."""
    return settings_from_args(run_parser("hermes-batch run").parse_args(
        ["--dataset_file", "d.jsonl", "--batch_size", "1", "--run_name", "r", *flags]))


def test_a_server_slower_than_the_setting_fails_the_prompt_naming_the_setting(slow):
    settings = from_command_line("--base_url", slow.base_url, "--model", "m", "--request_timeout", "0.2",
                                 "--max_retries", "0")
    client = ModelClient(settings, "k")
    try:
        with pytest.raises(ModelError) as failed:
            client.complete([{"role": "user", "content": "hi"}], [])
    finally:
        client.close()
    assert failed.value.kind == TIMED_OUT and failed.value.transient
    assert str(failed.value) == "model endpoint failed: Request timed out. No answer within --request_timeout 0.2 s."
    assert slow.requests == 1


def test_a_streamed_request_names_the_setting_too(slow):
    client = ModelClient(AgentSettings(model="m", base_url=slow.base_url, request_timeout=0.2, max_retries=0), "k")
    try:
        with pytest.raises(ModelError) as failed:
            client.complete_stream([{"role": "user", "content": "hi"}], [], lambda kind, text: None)
    finally:
        client.close()
    assert failed.value.kind == TIMED_OUT
    assert str(failed.value).endswith("No answer within --request_timeout 0.2 s.")


def test_a_setting_above_the_servers_time_passes(slow):
    settings = from_command_line("--base_url", slow.base_url, "--model", "m", "--request_timeout", "60",
                                 "--max_retries", "0")
    client = ModelClient(settings, "k")
    try:
        assert client.complete([{"role": "user", "content": "hi"}], []).message["content"] == "hello"
        seen: list[str] = []
        reply = client.complete_stream([{"role": "user", "content": "hi"}], [], lambda kind, text: seen.append(text))
        assert reply.message["content"] == "hello" and seen == ["hello"]
    finally:
        client.close()


def test_time_outs_are_retried_and_open_the_breaker_as_before(slow):
    """Each time-out is retried (max_retries) and counts toward the breaker, whose reason names the setting."""
    client = ModelClient(AgentSettings(model="m", base_url=slow.base_url, request_timeout=0.2, max_retries=1,
                                       breaker_seconds=0.01), "k")
    try:
        with pytest.raises(ModelError) as failed:
            client.complete([{"role": "user", "content": "hi"}], [])
    finally:
        client.close()
    assert failed.value.kind == TIMED_OUT
    assert slow.requests == 2
    assert client.breaker.reason == "no answer within --request_timeout 0.2 s"


def test_the_setting_defaults_to_600_seconds_and_must_be_positive():
    assert AgentSettings().request_timeout == 600.0
    assert from_command_line().request_timeout == 600.0
    for bad in ("0", "-5"):
        with pytest.raises(ValidationError, match="request_timeout"):
            from_command_line("--request_timeout", bad)
