"""An endpoint's "context length exceeded" answer ends that prompt as partial with the reason
`context_length`, its trajectory kept, and the run goes on; a resume does not retry it. Tool
results are cut to fit a known context before that. The test's own loopback server answers."""
from __future__ import annotations

import pytest

from hermes.data import journal
from hermes.model.context import context_exceeded
from hermes.run import direct
from hermes.settings import RunSettings
from tests.helpers import write_dataset
from tests.wire_server import WireServer, completion, error

VLLM = ("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
        "(4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.")


def tool_call(command: str) -> dict:
    body = completion(content="", reasoning="Let me look.")
    body["choices"][0]["message"]["tool_calls"] = [
        {"id": "call_1", "type": "function", "function": {"name": "terminal", "arguments": f'{{"command": "{command}"}}'}}]
    body["choices"][0]["finish_reason"] = "tool_calls"
    return body


def answer(method, path, body):
    if method == "GET":
        return 200, {"object": "list", "data": [{"id": "m", "object": "model"}]}
    prompt = body["messages"][1]["content"]
    turn = sum(m["role"] == "assistant" for m in body["messages"])
    if prompt.startswith("long") and turn == 1:
        return error(400, VLLM, None)
    if prompt.startswith("big") and turn == 0:
        return 200, tool_call("head -c 60000 /dev/zero | tr '\\\\0' x")
    return 200, (tool_call("echo hi") if turn == 0 else completion("Done."))


def settings(tmp_path, base_url, rows, **kw):
    return RunSettings(**{"dataset_file": str(write_dataset(tmp_path / "d.jsonl", rows)), "run_name": "ctx",
                          "output_dir": str(tmp_path / "data"), "base_url": base_url, "model": "m", "batch_size": 2,
                          "num_workers": 2, "distribution": "terminal_only",
                          "sandbox": {"backend": "local", "prefetch": False}, **kw})


def test_a_context_length_answer_ends_the_prompt_as_partial_and_the_run_goes_on(tmp_path):
    rows = [{"prompt": "long conversation"}, {"prompt": "short one"}]
    with WireServer(answer) as server:
        stats = direct.run(settings(tmp_path, server.base_url, rows))
        asked = len(server.chat_bodies())
        assert asked == 4  # two turns each: the refusal is not retried by the client
        again = direct.run(settings(tmp_path, server.base_url, rows, resume=True))
        assert len(server.chat_bodies()) == asked  # nor by a resume
    assert (stats["prompts_completed"], stats["prompts_partial"], stats["prompts_failed"]) == (1, 1, 0)
    assert again["prompts_partial"] == 1
    (partial,) = [e for _, p in journal.batch_files(tmp_path / "data" / "ctx") for e in journal.read(p)
                  if e["partial"]]
    assert partial["hermes"]["stop_reason"] == "context_length" and partial["hermes"]["error"] is None
    assert [t["from"] for t in partial["conversations"]] == ["system", "human", "gpt", "tool"]  # kept


def test_tool_results_are_cut_to_fit_a_known_context(tmp_path):
    with WireServer(answer) as server:
        direct.run(settings(tmp_path, server.base_url, [{"prompt": "big output"}], context_length=3000))
        second = server.chat_bodies()[1]
    result = second["messages"][-1]
    assert result["role"] == "tool" and "characters cut to fit the model's context" in result["content"]
    assert len(result["content"]) < 3000 * 3


@pytest.mark.parametrize("status, text, exceeded", [
    (400, b'{"error": {"code": "context_length_exceeded", "message": "..."}}', True),  # OpenAI
    (400, VLLM.encode(), True),
    (400, b'{"error": {"message": "the request exceeds the available context size, try increasing it"}}', True),
    (400, b'{"error": {"message": "unknown field: top_k"}}', False),
    (500, VLLM.encode(), False),
])
def test_the_servers_words_for_a_context_too_long(status, text, exceeded):
    assert context_exceeded(status, text) is exceeded
