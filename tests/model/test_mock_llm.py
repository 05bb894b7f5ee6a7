"""The scripted mock LLM, exercised with the real openai SDK over loopback HTTP."""
from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from mockllm import MockLLM, main
from mockllm.conversation import conversation_token

ROOT = Path(__file__).resolve().parents[2]


def tool(name: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": f"the {name} tool",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": True}}}


TOOLS = [tool("write_file"), tool("terminal"), tool("read_file")]


@pytest.fixture(scope="module")
def llm():
    with MockLLM(seed=1) as server:
        yield server


@pytest.fixture
def client(llm):
    llm.reset()
    with openai.OpenAI(base_url=llm.base_url, api_key="x", max_retries=0, timeout=30) as c:
        yield c


def ask(client, messages, tools=TOOLS, **kwargs):
    kwargs = {"tools": tools, **kwargs} if tools else kwargs
    return client.chat.completions.create(model="hermes-test", messages=messages, **kwargs)


def as_message(message) -> dict:
    """An SDK assistant message as the dict an agent would append to the history."""
    out = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [tc.model_dump() for tc in message.tool_calls]
    return out


def tool_outputs(message, outputs: dict[str, str]) -> list[dict]:
    return [{"role": "tool", "tool_call_id": tc.id, "content": outputs.get(tc.function.name, "ok")}
            for tc in message.tool_calls or []]


def calls_of(message) -> list[tuple[str, str, str]]:
    return [(tc.id, tc.function.name, tc.function.arguments) for tc in message.tool_calls or []]


def script_prompt(*turns: dict, intro: str = "Please follow the script.") -> str:
    return f"{intro}\nMOCK_SCRIPT: {json.dumps({'turns': list(turns)})}\n"


def stream_accumulate(client, messages, tools=TOOLS, **kwargs) -> dict:
    """Consume a streamed answer with the SDK and rebuild the message from its deltas."""
    stream = ask(client, messages, tools, stream=True, stream_options={"include_usage": True}, **kwargs)
    content, reasoning, reasoning_content, calls = "", "", "", {}
    finish_reason, usage, roles = None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            roles += [delta.role] if delta.role else []
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning", None) or ""
            reasoning_content += getattr(delta, "reasoning_content", None) or ""
            for tc in delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                if tc.function:
                    call["name"] += tc.function.name or ""
                    call["arguments"] += tc.function.arguments or ""
            finish_reason = choice.finish_reason or finish_reason
    return {
        "roles": roles, "content": content or None, "reasoning": reasoning or None,
        "reasoning_content": reasoning_content or None, "finish_reason": finish_reason, "usage": usage,
        "tool_calls": [(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())],
    }


# --------------------------------------------------------------------------- default scenario


def test_default_scenario_walkthrough(client, llm):
    prompt = "Write a note and tell me the hostname."
    k = conversation_token(prompt)
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": prompt}]

    first = ask(client, messages)
    assert first.object == "chat.completion" and first.id and first.created > 0
    assert first.model == "hermes-test"
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert calls_of(choice.message) == [
        (f"call_{k}_0_0", "write_file", json.dumps({"path": f"notes/{k}.txt", "content": f"token {k}\n"})),
        (f"call_{k}_0_1", "terminal", json.dumps({"command": "cat /etc/hostname"})),
    ]
    assert choice.message.reasoning and choice.message.reasoning == choice.message.reasoning_content
    usage = first.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    messages += [as_message(choice.message),
                 *tool_outputs(choice.message, {"terminal": json.dumps({"output": "sandbox-42\n", "exit_code": 0})})]
    second = ask(client, messages).choices[0]
    assert second.finish_reason == "tool_calls"
    assert calls_of(second.message) == [(f"call_{k}_1_0", "read_file", json.dumps({"path": f"notes/{k}.txt"}))]

    messages += [as_message(second.message), *tool_outputs(second.message, {"read_file": f"token {k}\n"})]
    final = ask(client, messages).choices[0]
    assert final.finish_reason == "stop"
    assert not final.message.tool_calls
    assert final.message.content == f"Done. hostname=sandbox-42; notes/{k}.txt=token {k}"
    assert "3 tool result" in final.message.reasoning

    assert llm.stats()["ok"] == 3
    assert [len(body["messages"]) for body in llm.requests()] == [2, 5, 7]


def test_same_prompt_same_answer(client):
    messages = [{"role": "user", "content": "stable?"}]
    assert calls_of(ask(client, messages).choices[0].message) == calls_of(ask(client, messages).choices[0].message)


def test_no_tools_answers_at_once(client):
    choice = ask(client, [{"role": "user", "content": "Just say hi."}], tools=None).choices[0]
    assert choice.finish_reason == "stop" and choice.message.content == "Done."
    assert choice.message.tool_calls is None


def test_only_offered_tools_are_called(client):
    messages = [{"role": "user", "content": "terminal only"}]
    first = ask(client, messages, tools=[tool("terminal")]).choices[0].message
    assert [c[1] for c in calls_of(first)] == ["terminal"]
    messages += [as_message(first), *tool_outputs(first, {"terminal": "box\n"})]
    final = ask(client, messages, tools=[tool("terminal")]).choices[0]
    assert final.finish_reason == "stop" and final.message.content == "Done. hostname=box"


def test_turns_option_adds_middle_terminal_steps():
    with MockLLM(turns=5) as server, openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
        messages = [{"role": "user", "content": "five calls"}]
        commands = []
        for _ in range(10):
            message = ask(c, messages).choices[0].message
            if not message.tool_calls:
                break
            commands.append([(tc.function.name, json.loads(tc.function.arguments)) for tc in message.tool_calls])
            messages += [as_message(message), *tool_outputs(message, {})]
        assert server.stats()["ok"] == 5
        assert [[name for name, _ in turn] for turn in commands] == [
            ["write_file", "terminal"], ["terminal"], ["terminal"], ["read_file"]]
        assert commands[1][0][1] == {"command": "echo step 1"}
        assert commands[2][0][1] == {"command": "echo step 2"}


def test_hallucinate_rate_adds_unknown_tool_in_turn_zero():
    with MockLLM(hallucinate_rate=1.0) as server, openai.OpenAI(base_url=server.base_url, api_key="x") as c:
        messages = [{"role": "user", "content": "fetch something"}]
        first = ask(c, messages).choices[0].message
        assert [name for _, name, _ in calls_of(first)] == ["write_file", "terminal", "web_fetch_imaginary"]
        messages += [as_message(first), *tool_outputs(first, {})]
        assert [name for _, name, _ in calls_of(ask(c, messages).choices[0].message)] == ["read_file"]
    with MockLLM(hallucinate_rate=0.5, seed=3) as server, openai.OpenAI(base_url=server.base_url, api_key="x") as c:
        hits = sum("web_fetch_imaginary" in [n for _, n, _ in calls_of(
            ask(c, [{"role": "user", "content": f"prompt {i}"}]).choices[0].message)] for i in range(40))
        assert 5 < hits < 35


# --------------------------------------------------------------------------- streaming


def test_stream_accumulates_to_the_non_stream_answer(client):
    messages = [{"role": "user", "content": "stream me"}]
    for _ in range(3):
        plain = ask(client, messages)
        message = plain.choices[0].message
        streamed = stream_accumulate(client, messages)
        assert streamed["roles"] == ["assistant"]
        assert streamed["tool_calls"] == calls_of(message)
        assert streamed["content"] == message.content
        assert streamed["reasoning"] == message.reasoning == streamed["reasoning_content"]
        assert streamed["finish_reason"] == plain.choices[0].finish_reason
        assert streamed["usage"].total_tokens == plain.usage.total_tokens
        messages += [as_message(message), *tool_outputs(message, {"terminal": "h"})]
    assert streamed["finish_reason"] == "stop" and streamed["content"].startswith("Done.")


def test_stream_wire_format(llm):
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "raw"}], "tools": TOOLS}
    with httpx.stream("POST", f"{llm.base_url}/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert "usage" not in chunks[-1]  # no include_usage: no usage chunk
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    first_call_deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks
                         if c["choices"][0]["delta"].get("tool_calls")]
    assert first_call_deltas[0]["function"]["name"] == "write_file" and first_call_deltas[0]["id"]
    assert len(first_call_deltas) > 4  # arguments arrive in pieces


def test_scripted_stream_with_raw_arguments(client):
    prompt = script_prompt({"content": "calling", "tool_calls": [
        {"name": "terminal", "arguments": {"command": "ls"}}, {"name": "nope", "arguments": "{broken"}]})
    messages = [{"role": "user", "content": prompt}]
    assert stream_accumulate(client, messages)["tool_calls"] == calls_of(ask(client, messages).choices[0].message)


# --------------------------------------------------------------------------- MOCK_SCRIPT


def test_mock_script_turns(client):
    prompt = script_prompt(
        {"reasoning": "think hard", "content": "Let me try.", "tool_calls": [
            {"name": "terminal", "arguments": {"command": "ls"}},
            {"name": "does_not_exist", "arguments": {"x": 1}},
            {"name": "read_file", "arguments": '{"path": "a.txt"'}]},
        {"content": "All finished."},
    )
    k = conversation_token(prompt)
    messages = [{"role": "user", "content": prompt}]
    first = ask(client, messages).choices[0]
    assert first.finish_reason == "tool_calls"
    assert first.message.content == "Let me try."
    assert first.message.reasoning == "think hard"
    assert calls_of(first.message) == [
        (f"call_{k}_0_0", "terminal", '{"command": "ls"}'),
        (f"call_{k}_0_1", "does_not_exist", '{"x": 1}'),
        (f"call_{k}_0_2", "read_file", '{"path": "a.txt"'),  # verbatim, unparseable
    ]
    messages += [as_message(first.message), *tool_outputs(first.message, {})]
    second = ask(client, messages).choices[0]
    assert (second.finish_reason, second.message.content, second.message.tool_calls) == ("stop", "All finished.", None)
    assert getattr(second.message, "reasoning", None) is None
    messages += [as_message(second.message), {"role": "user", "content": "more?"}]
    assert ask(client, messages).choices[0].message.content == "Done."


def test_mock_script_after_text_on_the_same_line(client):
    prompt = "Custom task, see script. MOCK_SCRIPT: " + json.dumps({"turns": [{"content": "inline ok"}]}) + "  (end)"
    assert ask(client, [{"role": "user", "content": prompt}]).choices[0].message.content == "inline ok"


def test_mock_script_in_content_parts(client):
    prompt = script_prompt({"content": "from parts"})
    messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
    assert ask(client, messages).choices[0].message.content == "from parts"


def test_mock_script_error_turn_fails_every_time(client, llm):
    prompt = script_prompt({"content": "fine"}, {"error": 500})
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": "fine"},
                {"role": "user", "content": "go on"}]
    for _ in range(3):
        with pytest.raises(openai.InternalServerError) as info:
            ask(client, messages)
        assert info.value.status_code == 500
        assert info.value.body["type"] == "server_error"
        assert "MOCK_SCRIPT" in info.value.body["message"]
    assert ask(client, messages[:1]).choices[0].message.content == "fine"
    assert llm.stats()["errors"] == 3


def test_mock_script_sleep(client, llm):
    # The server holds a sleeping turn's answer: a client that waits less gives up (a server that
    # did not sleep would answer within milliseconds), and one that waits gets it.
    prompt = script_prompt({"sleep": 3, "content": "slow"})
    messages = [{"role": "user", "content": prompt}]
    with openai.OpenAI(base_url=llm.base_url, api_key="x", max_retries=0, timeout=0.3) as impatient:
        with pytest.raises(openai.APITimeoutError):
            ask(impatient, messages)
    assert ask(client, messages).choices[0].message.content == "slow"


def test_malformed_mock_script_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, [{"role": "user", "content": "MOCK_SCRIPT: {not json"}])
    assert "MOCK_SCRIPT" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        ask(client, [{"role": "user", "content": 'MOCK_SCRIPT: {"turns": [{"tool_calls": [{"args": 1}]}]}'}])


# --------------------------------------------------------------------------- errors on demand


def test_fail_first_with_429_and_retry_after():
    with MockLLM(fail_first=2, error_status=429, retry_after=7) as server, \
            openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
        for prompt in ("conversation A", "conversation B"):
            messages = [{"role": "user", "content": prompt}]
            for _ in range(2):
                with pytest.raises(openai.RateLimitError) as info:
                    ask(c, messages)
                err = info.value
                assert err.status_code == 429
                assert err.response.headers["retry-after"] == "7"
                assert err.body == {"message": err.body["message"], "type": "rate_limit_error",
                                    "param": None, "code": "rate_limit_exceeded"}
            assert ask(c, messages).choices[0].finish_reason == "tool_calls"
        assert server.stats()["injected_errors"] == 4


def test_sdk_retries_honour_retry_after(caplog):
    with MockLLM(fail_first=2, error_status=429, retry_after=0.05) as server, \
            openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=2) as c, \
            caplog.at_level("INFO", logger="openai"):
        assert ask(c, [{"role": "user", "content": "retry me"}]).choices[0].finish_reason == "tool_calls"
        assert server.stats()["requests"] == 3
    # The SDK says how long it waits before each retry: the server's Retry-After, not its own backoff.
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Retrying request in ")]
    assert waits == [f"Retrying request in 0.050000 seconds (retry {i} of 2)" for i in (1, 2)], waits


def test_fail_first_503_and_500():
    for status, exc in ((503, openai.InternalServerError), (500, openai.InternalServerError)):
        with MockLLM(fail_first=1, error_status=status) as server, \
                openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
            with pytest.raises(exc) as info:
                ask(c, [{"role": "user", "content": "x"}])
            assert info.value.status_code == status
            assert ("retry-after" in info.value.response.headers) == (status == 503)


def test_error_rate_is_seeded():
    def outcomes(seed: int, rate: float) -> list[bool]:
        with MockLLM(error_rate=rate, seed=seed, error_status=503) as server, \
                openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
            result = []
            for i in range(30):
                try:
                    ask(c, [{"role": "user", "content": f"p{i}"}])
                    result.append(True)
                except openai.InternalServerError:
                    result.append(False)
            return result

    first = outcomes(7, 0.5)
    assert first == outcomes(7, 0.5)
    assert 3 < first.count(False) < 27
    assert outcomes(7, 1.0) == [False] * 30


def test_bad_requests_get_openai_400s(llm):
    url = f"{llm.base_url}/chat/completions"
    cases = [
        b"{not json",
        b"[1, 2]",
        json.dumps({"model": "m"}).encode(),
        json.dumps({"model": "m", "messages": []}).encode(),
        json.dumps({"model": "m", "messages": ["hi"]}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
        json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": "x"}).encode(),
        b"\xff\xfe",
        b"",
    ]
    with httpx.Client() as http:
        for raw in cases:
            response = http.post(url, content=raw, headers={"Content-Type": "application/json"})
            assert response.status_code == 400, raw
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error" and error["message"] and error["code"]
        assert http.get(f"{llm.url}/nowhere").status_code == 404
        assert http.get(f"{llm.url}/health").json() == {"status": "ok"}


# --------------------------------------------------------------------------- reasoning modes


@pytest.mark.parametrize("mode", ["field", "content", "inline", "scratchpad", "none"])
def test_reasoning_modes(mode):
    prompt = script_prompt({"reasoning": "weigh it", "content": "answer",
                            "tool_calls": [{"name": "terminal", "arguments": {"command": "ls"}}]})
    with MockLLM(reasoning=mode) as server, openai.OpenAI(base_url=server.base_url, api_key="x") as c:
        messages = [{"role": "user", "content": prompt}]
        message = ask(c, messages).choices[0].message
        streamed = stream_accumulate(c, messages)
    expected = {
        "field": ("answer", "weigh it", "weigh it"),
        "content": ("answer", None, "weigh it"),
        "inline": ("<think>weigh it</think>\nanswer", None, None),
        "scratchpad": ("<REASONING_SCRATCHPAD>weigh it</REASONING_SCRATCHPAD>\nanswer", None, None),
        "none": ("answer", None, None),
    }[mode]
    got = (message.content, getattr(message, "reasoning", None), getattr(message, "reasoning_content", None))
    assert got == expected
    assert (streamed["content"], streamed["reasoning"], streamed["reasoning_content"]) == expected
    assert streamed["tool_calls"] == calls_of(message)


def test_invalid_reasoning_mode_rejected():
    with pytest.raises(ValueError):
        MockLLM(reasoning="loud")


# --------------------------------------------------------------------------- recording & misc endpoints


def test_requests_record_extra_body(client, llm):
    extra = {"reasoning": {"enabled": True, "effort": "high"}, "provider": {"order": ["acme"], "sort": "price"}}
    ask(client, [{"role": "user", "content": "one"}], extra_body=extra, temperature=0.2)
    ask(client, [{"role": "user", "content": "two"}], tools=None)
    with httpx.Client() as http:
        recorded = http.get(f"{llm.url}/_mock/requests").json()
        assert [body["messages"][0]["content"] for body in recorded] == ["one", "two"]
        assert recorded[0]["reasoning"] == extra["reasoning"]
        assert recorded[0]["provider"] == extra["provider"]
        assert recorded[0]["temperature"] == 0.2 and recorded[0]["model"] == "hermes-test"
        assert [t["function"]["name"] for t in recorded[0]["tools"]] == ["write_file", "terminal", "read_file"]
        stats = http.get(f"{llm.url}/_mock/stats").json()
        assert stats["requests"] == 2 and stats["ok"] == 2
        assert http.post(f"{llm.url}/_mock/reset").status_code == 200
        assert http.get(f"{llm.url}/_mock/requests").json() == []
        assert http.get(f"{llm.url}/_mock/stats").json()["requests"] == 0


def test_models_endpoint(client):
    assert [m.id for m in client.models.list()] == ["mock-model"]


def test_start_stop_and_context_manager():
    server = MockLLM()
    base_url = server.start()
    assert base_url == server.base_url and base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
    assert server.port != 0
    assert httpx.get(f"{server.url}/health").status_code == 200
    server.stop()
    server.stop()  # idempotent
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health", timeout=2)


# --------------------------------------------------------------------------- concurrency


def test_64_concurrent_requests_are_not_serialised():
    # What the server saw, not how long it took (speed is bench/'s business): at least half of
    # the 64 held requests were in flight at once. A serialising server would show 1.
    latency, n = 1.0, 64
    with MockLLM(latency=latency) as server, \
            openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120) as c:
        def one(i: int) -> str:
            return ask(c, [{"role": "user", "content": f"parallel {i}"}]).choices[0].finish_reason

        with ThreadPoolExecutor(n) as pool:
            results = list(pool.map(one, range(n)))
        assert results == ["tool_calls"] * n
        assert server.stats()["max_in_flight"] >= n // 2, server.stats()


# --------------------------------------------------------------------------- CLI


def test_cli_serves_until_terminated():
    proc = subprocess.Popen([sys.executable, "-m", "mockllm", "--port", "0", "--reasoning", "inline"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("mock-llm listening on http://127.0.0.1:"), line + proc.stderr.read()
        base_url = line.split()[-1]
        with openai.OpenAI(base_url=base_url, api_key="x") as c:
            content = ask(c, [{"role": "user", "content": "hi"}], tools=None).choices[0].message.content
        assert content.startswith("<think>") and content.endswith("Done.")
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_cli_rejects_bad_options(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--error-status", "404"])
    assert exited.value.code == 2
    assert "argument --error-status: invalid choice: 404" in capsys.readouterr().err
    assert main(["--port", "0", "--error-rate", "2"]) == 2
    assert "error_rate" in capsys.readouterr().err


def test_a_request_cut_off_before_its_body_is_not_recorded():
    """A client killed between its headers and its body (a SIGKILL mid-request) sent no request:
    the log keeps nothing for it, and the next request is served as usual."""
    import socket

    with MockLLM() as llm:
        with socket.create_connection(("127.0.0.1", llm.port)) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 400\r\n\r\n")  # headers only, as when killed between the two writes
            s.shutdown(socket.SHUT_WR)
            s.settimeout(30)
            assert s.recv(100) == b""  # no answer: the server closed the connection
        reply = httpx.post(f"{llm.base_url}/chat/completions", timeout=30,
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200
        assert [r["messages"][0]["content"] for r in llm.requests()] == ["hi"]


def test_a_request_body_sent_chunked_is_read():
    """A client that streams its body (Transfer-Encoding: chunked, no Content-Length) is answered
    like any other, and its request is recorded whole."""
    def body():
        yield b'{"model": "m", "messages": [{"role": "user", '
        yield b'"content": "chunked hi"}]}'

    with MockLLM() as llm:
        reply = httpx.post(f"{llm.base_url}/chat/completions", content=body(), timeout=30,
                           headers={"Content-Type": "application/json"})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"]
        assert [r["messages"][0]["content"] for r in llm.requests()] == ["chunked hi"]
