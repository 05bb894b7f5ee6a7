"""The model client and agent loop against the real scripted server on loopback, tools in a local sandbox."""
from __future__ import annotations

import json

import httpx
import pytest

from hermes.agent.loop import run_agent
from mockllm import MockLLM
from hermes.model.client import ModelClient, ModelError, extra_body
from hermes.sandbox.base import SandboxSettings, SandboxSpec
from hermes.sandbox.local import LocalSandbox
from hermes.settings import RunSettings
from hermes.tools import openai_schemas, tools_for


def settings(base_url: str, **kw) -> RunSettings:
    return RunSettings(dataset_file="x", batch_size=1, run_name="t", base_url=base_url, model="m", **kw)


def requests_seen(server: MockLLM) -> list[dict]:
    data = httpx.get(server.url + "/_mock/requests").json()
    return data["requests"] if isinstance(data, dict) else data


def test_extra_body_encodes_reasoning_and_routing_as_openrouter_expects():
    s = settings("http://x", reasoning_effort="low", providers_ignored="a, b", providers_order="c", provider_sort="latency")
    assert extra_body(s) == {"reasoning": {"enabled": True, "effort": "low"},
                             "provider": {"ignore": ["a", "b"], "order": ["c"], "sort": "latency"}}
    disabled = settings("http://x", reasoning_effort="high", reasoning_disabled=True)
    assert extra_body(disabled) == {"reasoning": {"effort": "none"}}
    assert extra_body(settings("http://x")) == {}


def test_the_wire_body_is_what_an_openrouter_endpoint_expects():
    tools = openai_schemas(tools_for(["terminal"]))
    with MockLLM() as server:
        client = ModelClient(settings(server.base_url, max_tokens=50, reasoning_effort="high", providers_allowed="x"))
        messages = [{"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "earlier", "reasoning": "kept for the trajectory only"}]
        reply = client.complete(messages, tools)
        (body,) = requests_seen(server)
    assert set(body) == {"model", "messages", "tools", "max_tokens", "reasoning", "provider"}
    assert body["reasoning"] == {"enabled": True, "effort": "high"} and body["provider"] == {"only": ["x"]}
    assert body["messages"][1] == {"role": "assistant", "content": "earlier"}  # reasoning is not sent back
    assert body["tools"] == tools and body["model"] == "m"
    assert reply.message["role"] == "assistant" and reply.message["reasoning"]
    assert set(reply.usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    # The history already holds one assistant turn: the default scenario answers it with its final turn.
    assert reply.finish_reason == "stop" and not reply.message.get("tool_calls")
    assert reply.message["content"].startswith("Done.")


def test_rate_limits_are_retried_honouring_retry_after():
    with MockLLM(fail_first=2, error_status=429, retry_after=0.2) as server:
        client = ModelClient(settings(server.base_url, max_tokens=77))
        reply = client.complete([{"role": "user", "content": "hi"}], [])
        assert reply.message["content"]
        sent = requests_seen(server)
        assert len(sent) == 3 and all(b["max_tokens"] == 77 for b in sent)


def test_a_persistent_server_error_becomes_a_model_error():
    with MockLLM(error_rate=1.0, error_status=500) as server:
        client = ModelClient(settings(server.base_url), max_retries=1)
        with pytest.raises(ModelError, match="500"):
            client.complete([{"role": "user", "content": "hi"}], [])


def test_agent_loop_runs_tools_and_keeps_reasoning(tmp_path):
    tools = openai_schemas(tools_for(["terminal", "file"]))
    with MockLLM() as server, LocalSandbox(SandboxSpec(image="-"), SandboxSettings(backend="local")) as box:
        client = ModelClient(settings(server.base_url))
        run = run_agent(client, "please work", tools, box, max_turns=10, system_prompt="SYS",
                        prefill=[{"role": "user", "content": "few-shot"}, {"role": "assistant", "content": "ok"}])
        sent = requests_seen(server)
    assert run.completed and not run.partial and run.error is None
    assert run.api_calls == 3 == len(sent)
    roles = [m["role"] for m in run.messages]
    assert roles == ["user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]
    assert all(m.get("reasoning") for m in run.messages if m["role"] == "assistant")
    # system prompt and prefill are sent but never part of the saved conversation
    assert [m["role"] for m in sent[0]["messages"]] == ["system", "user", "assistant", "user"]
    assert sent[0]["messages"][0]["content"] == "SYS"
    assert all("reasoning" not in m for m in sent[-1]["messages"])
    read = json.loads(run.messages[5]["content"])
    assert "token" in read["content"]
    assert run.usage["total_tokens"] > 0


def test_agent_stops_at_max_turns_as_partial(tmp_path):
    tools = openai_schemas(tools_for(["terminal"]))
    with MockLLM(turns=6) as server, LocalSandbox(SandboxSpec(image="-"), SandboxSettings(backend="local")) as box:
        run = run_agent(ModelClient(settings(server.base_url)), "go", tools, box, max_turns=2)
    assert run.partial and not run.completed and run.api_calls == 2


def test_unknown_tool_gets_an_error_result_not_a_crash(tmp_path):
    prompt = "MOCK_SCRIPT: " + json.dumps({"turns": [
        {"reasoning": "r", "tool_calls": [{"name": "nope", "arguments": {}}, {"name": "terminal", "arguments": "{bad"}]}]})
    with MockLLM() as server, LocalSandbox(SandboxSpec(image="-"), SandboxSettings(backend="local")) as box:
        run = run_agent(ModelClient(settings(server.base_url)), prompt, openai_schemas(tools_for(["terminal"])), box, max_turns=3)
    results = [json.loads(m["content"]) for m in run.messages if m["role"] == "tool"]
    assert "Unknown tool: nope" in results[0]["error"]
    assert "Invalid JSON arguments" in results[1]["error"]
    assert run.completed
