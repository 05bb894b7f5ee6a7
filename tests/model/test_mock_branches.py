"""Branched MOCK_SCRIPTs (mockllm.branches): one instruction, pass or fail per conversation, chosen at
its first turn from the visit count or the request's seed, and kept over its later turns. The real
openai SDK against the bundled server on loopback."""
from __future__ import annotations

import json

import openai
import pytest

from mockllm import MockLLM
from mockllm.branches import draw
from mockllm.conversation import conversation_token

TOOLS = [{"type": "function", "function": {"name": "terminal", "description": "a shell",
                                            "parameters": {"type": "object", "properties": {}}}}]
PASS = {"turns": [{"tool_calls": [{"name": "terminal", "arguments": {"command": "echo ok > out.txt"}}]},
                  {"content": "solved"}]}
FAIL = {"turns": [{"tool_calls": [{"name": "terminal", "arguments": {"command": "echo no"}}]},
                  {"content": "gave up"}]}


def prompt(**fields) -> str:
    return "Write ok to out.txt. MOCK_SCRIPT: " + json.dumps({"pass": PASS, "fail": FAIL, **fields})


@pytest.fixture
def llm():
    with MockLLM() as server:
        yield server


def converse(client, user: str, seed: int | None = None, seeds_per_turn: bool = True) -> tuple[str, str]:
    """One whole conversation as an agent would hold it: (first command, final answer)."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": user}]
    extra = {} if seed is None else {"seed": seed}
    first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, **extra).choices[0].message
    call = first.tool_calls[0]
    messages += [{"role": "assistant", "content": first.content, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "ok"}]
    if seed is not None and seeds_per_turn:
        extra = {"seed": seed + 7919}  # hermes's seed changes every turn: the choice must not follow it
    last = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, **extra).choices[0].message
    return json.loads(call.function.arguments)["command"], last.content


def outcome(conversation: tuple[str, str]) -> str:
    command, final = conversation
    assert (command, final) in {("echo ok > out.txt", "solved"), ("echo no", "gave up")}, conversation  # never mixed
    return "pass" if final == "solved" else "fail"


def test_pass_on_picks_the_listed_conversations_and_keeps_each_on_its_branch(llm):
    with openai.OpenAI(base_url=llm.base_url, api_key="x", max_retries=0) as client:
        user = prompt(pass_on=[2, 4])
        assert [outcome(converse(client, user)) for _ in range(5)] == ["fail", "pass", "fail", "pass", "fail"]
        # another instruction counts its own conversations
        assert outcome(converse(client, "Other. " + prompt(pass_on=[1]))) == "pass"
        llm.reset()  # the count starts over
        assert outcome(converse(client, user)) == "fail" and outcome(converse(client, user)) == "pass"


def test_pass_chance_draws_from_the_seed_of_the_first_turn_the_same_on_every_rerun(llm):
    user = prompt(pass_chance=0.3)
    token = conversation_token(user)
    seeds = list(range(1000, 1200))
    with openai.OpenAI(base_url=llm.base_url, api_key="x", max_retries=0) as client:
        got = [outcome(converse(client, user, seed)) for seed in seeds]
        assert got == [outcome(converse(client, user, seed)) for seed in seeds]  # a rerun: same seeds, same verdicts
        # the visit count does not matter when a seed is sent: a fresh server answers alike
        llm.reset()
        assert [outcome(converse(client, user, seed)) for seed in seeds[:20]] == got[:20]
    assert got == ["pass" if draw(token, f"seed {s}") < 0.3 else "fail" for s in seeds]
    assert 0.2 < got.count("pass") / len(got) < 0.4  # 200 seeded draws at p = 0.3 (fixed seeds: no flakiness)


def test_certain_chances_and_the_visit_fallback_without_a_seed(llm):
    with openai.OpenAI(base_url=llm.base_url, api_key="x", max_retries=0) as client:
        assert {outcome(converse(client, prompt(pass_chance=1), s)) for s in range(20)} == {"pass"}
        assert {outcome(converse(client, prompt(pass_chance=0), s)) for s in range(20)} == {"fail"}
        user = prompt(pass_chance=0.5)
        token = conversation_token(user)
        got = [outcome(converse(client, user)) for _ in range(12)]  # no seed: drawn from visits 1..12
        assert got == ["pass" if draw(token, f"visit {n}") < 0.5 else "fail" for n in range(1, 13)]
        assert {"pass", "fail"} <= set(got)


def test_the_branch_rides_in_the_tool_call_ids_not_in_server_memory():
    user = prompt(pass_on=[1])
    token = conversation_token(user)
    with MockLLM() as first:
        with openai.OpenAI(base_url=first.base_url, api_key="x", max_retries=0) as client:
            messages = [{"role": "user", "content": user}]
            reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
    call = reply.tool_calls[0]
    assert call.id == f"call_{token}P_0_0"
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "ok"}]
    with MockLLM() as restarted:  # a new server, no count: the history alone says "pass"
        with openai.OpenAI(base_url=restarted.base_url, api_key="x", max_retries=0) as client:
            answer = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
    assert answer.content == "solved"


@pytest.mark.parametrize("script, why", [
    ({"pass": PASS, "fail": FAIL}, "needs pass_chance or pass_on"),
    ({"pass": PASS, "pass_on": [1]}, "fail must be an object"),
    ({"pass": PASS, "fail": FAIL, "pass_chance": 1.5}, "pass_chance must be a number between 0 and 1"),
    ({"pass": PASS, "fail": FAIL, "pass_on": [0]}, "pass_on must be a list"),
    ({"pass": {"turns": [{"sleep": -1}]}, "fail": FAIL, "pass_on": [1]}, "sleep must be a non-negative number"),
])
def test_malformed_branched_scripts_are_400s(llm, script, why):
    with openai.OpenAI(base_url=llm.base_url, api_key="x", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError, match=why):
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "MOCK_SCRIPT: " + json.dumps(script)}])
