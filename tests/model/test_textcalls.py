"""Tool calls written as text (hermes.model.textcalls): every format, several calls in a turn, prose
around them, malformed JSON, unknown tools, string-encoded arguments, and texts that must not count.

The recorded answers (tests/model/recorded/*.json, one case each) are replayed by a loopback HTTP
server and read by the real ModelClient, so the case covers the client's hook and what it sends
back on the next turn; the parser's own cases call `recover` on the text.
"""
from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import get_args

import pytest

from hermes.model import textcalls
from hermes.model.client import ModelClient
from hermes.settings import AgentSettings, ToolCallParser
from hermes.tools import ToolContext, get_tool, openai_schemas, run_tool

RECORDED = Path(__file__).parent / "recorded"
CASES = sorted(RECORDED.glob("*.json"))
TOOLS = openai_schemas([get_tool(n) for n in ("terminal", "write_file", "read_file")])


class Replay:
    """A chat completions endpoint on loopback: POST /<case>/v1/chat/completions answers that case's
    recorded body; every request body is kept."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                me.seen.append(body)
                case = json.loads((RECORDED / (self.path.split("/")[1] + ".json")).read_text())
                raw = json.dumps(case["response"]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture(scope="module")
def replay():
    server = Replay()
    yield server
    server.server.shutdown()


def _arguments(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_recorded_answer(path: Path, replay: Replay):
    case = json.loads(path.read_text())
    tools = openai_schemas([get_tool(n) for n in case["tools"]])
    settings = AgentSettings(model="m", base_url=f"{replay.url}/{path.stem}/v1",
                             tool_call_parser=case.get("parser", "auto"))
    client = ModelClient(settings, "k", max_retries=0)
    try:
        history = [{"role": "user", "content": "do it"}]
        reply = client.complete(history, tools)
        message = reply.message
        expected = case["expected"]
        calls = message.get("tool_calls") or []
        assert [(c["function"]["name"], _arguments(c["function"]["arguments"])) for c in calls] == \
            [(c["name"], c["arguments"]) for c in expected["calls"]], case["about"]
        assert (message.get("content") or "") == expected["content"]
        assert textcalls.arrivals([message]) == _count(c["format"] for c in expected["calls"])
        assert len({c["id"] for c in calls}) == len(calls)  # each call has an id of its own

        # The next turn sends the recovered calls back as native ones, without the private field,
        # and never a null content beside them (llama.cpp's server answers 500 to that).
        client.complete(history + [message] + [{"role": "tool", "tool_call_id": c["id"], "content": "ok"}
                                               for c in calls], tools)
        sent = replay.seen[-1]["messages"][1]
        assert textcalls.ARRIVAL_KEY not in sent
        assert sent.get("tool_calls", []) == calls
        if calls:
            assert isinstance(sent["content"], str)
    finally:
        client.close()


def _count(formats) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in formats:
        out[f] = out.get(f, 0) + 1
    return dict(sorted(out.items()))


def _recovered(text: str, parser: str = "auto"):
    found = textcalls.recover(text, TOOLS, parser)
    return None if found is None else (found.content, [(c.name, _arguments(c.arguments), c.format) for c in found.calls])


@pytest.mark.parametrize("text, parser, expected", [
    ('<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>', "hermes",
     ("", [("terminal", {"command": "ls"}, "hermes")])),
    ('```json\n[{"name": "terminal", "arguments": {"command": "a"}}, {"name": "read_file", "arguments": {"path": "b"}}]\n```',
     "json", ("", [("terminal", {"command": "a"}, "json"), ("read_file", {"path": "b"}, "json")])),
    ('{"name": "terminal", "parameters": {"command": "a"}}; {"name": "terminal", "parameters": {"command": "b"}}', "llama",
     ("", [("terminal", {"command": "a"}, "llama"), ("terminal", {"command": "b"}, "llama")])),
    ('<|python_tag|>{"name": "terminal", "parameters": {"command": "a"}}', "llama",
     ("", [("terminal", {"command": "a"}, "llama")])),
    ('[TOOL_CALLS]terminal[ARGS]{"command": "uname"}', "mistral", ("", [("terminal", {"command": "uname"}, "mistral")])),
    ('<tool_call>\n<function=write_file>\n<parameter=path>\nx.txt\n</parameter>\n<parameter=content>\nline 1\nline 2\n\n'
     '</parameter>\n</function>\n</tool_call>', "qwen3_coder",
     ("", [("write_file", {"path": "x.txt", "content": "line 1\nline 2\n"}, "qwen3_coder")])),
    ('<tool_call>\n<function=terminal>\n{"command": "ls"}\n</function>\n</tool_call>', "auto",
     ("", [("terminal", {"command": "ls"}, "qwen3_coder")])),  # JSON arguments inside the XML tags
    # a whole answer of call-shaped JSON naming an offered tool (auto)
    ('{"name": "read_file", "arguments": {"path": "a"}}', "auto", ("", [("read_file", {"path": "a"}, "json")])),
    # OpenAI's own shape written as text
    ('```json\n{"type": "function", "function": {"name": "terminal", "arguments": "{\\"command\\": \\"x\\"}"}}\n```', "auto",
     ("", [("terminal", {"command": "x"}, "json")])),
    # several formats in one turn: each call keeps its own
    ('Plan.\n<tool_call>{"name": "terminal", "arguments": {"command": "a"}}</tool_call>\n'
     '[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "b"}}]', "auto",
     ("Plan.", [("terminal", {"command": "a"}, "hermes"), ("read_file", {"path": "b"}, "mistral")])),
    # an explicit parser looks for its own format only
    ('<tool_call>{"name": "terminal", "arguments": {"command": "a"}}</tool_call>', "mistral", None),
    # arguments that decode to something other than an object are kept for the tool's error
    ('<tool_call>{"name": "terminal", "arguments": "ls -la"}</tool_call>', "auto",
     ("", [("terminal", "ls -la", "hermes")])),
    # a marker with no readable name: a call of a name no tool has, so the model is told
    ('<tool_call>{oops}</tool_call>', "auto", ("", [(textcalls.UNREADABLE, "{oops}", "hermes")])),
    # XML inside <tools> (hermes.model.callsyntax): each shape, prose around kept
    ('Listing.\n<tools><function name="terminal" arguments=\'{"command": "ls"}\'/></tools>\nDone.', "auto",
     ("Listing.\nDone.", [("terminal", {"command": "ls"}, "hermes")])),
    ('<tools><function name="terminal" arguments=\'{"command": "ls > out.txt"}\'></function></tools>', "auto",
     ("", [("terminal", {"command": "ls > out.txt"}, "hermes")])),  # a `>` inside the quoted attribute
    ('<tools><function name="terminal" arguments="{}"/><function name="read_file" parameters=\'{"path": "a"}\'/></tools>',
     "auto", ("", [("terminal", {}, "hermes"), ("read_file", {"path": "a"}, "hermes")])),
    ('<tools>\n<function>\n<name>write_file</name>\n<arguments>\n<path>a.txt</path>\n<content>\nline 1\nline 2\n</content>\n'
     '</arguments>\n</function>\n</tools>', "auto",
     ("", [("write_file", {"path": "a.txt", "content": "line 1\nline 2"}, "hermes")])),
    ('<tools><function><name>terminal</name><arguments>{"command": "ls"}</arguments></function></tools>', "auto",
     ("", [("terminal", {"command": "ls"}, "hermes")])),
    ('<tools><function=terminal>{"command": "ls"}</function></tools>', "auto", ("", [("terminal", {"command": "ls"}, "hermes")])),
    ('<tools><function=terminal><parameter=command>ls</parameter></function></tools>', "auto",
     ("", [("terminal", {"command": "ls"}, "hermes")])),
    ('<tools><function=read_file><path>a</path></function><function=read_file><path>b</path></tools>', "auto",
     ("", [("read_file", {"path": "a"}, "hermes"), ("read_file", {"path": "b"}, "hermes")])),  # one left unclosed
    # explicit hermes takes XML calls of any name (the unknown one gets the error result)
    ('<tools><function name="bash" arguments=\'{"command": "ls"}\'/></tools>', "hermes",
     ("", [("bash", {"command": "ls"}, "hermes")])),
    # pythonic: explicit any name; auto a whole answer of offered tools only
    ('[terminal(command="ls"), read_file(path="a", limit=5)]', "auto",
     ("", [("terminal", {"command": "ls"}, "pythonic"), ("read_file", {"path": "a", "limit": 5}, "pythonic")])),
    ('<|python_start|>[terminal(command="ls", background=False)]<|python_end|>', "pythonic",
     ("", [("terminal", {"command": "ls", "background": False}, "pythonic")])),
    ('[web_search(query="x")]', "pythonic", ("", [("web_search", {"query": "x"}, "pythonic")])),
    ('[web_search(query="x")]', "auto", None),
    ('[terminal(command=os.system("rm -rf /"))]', "pythonic", None),  # not a literal: never evaluated
    ('[terminal("ls")]', "pythonic", None),  # positional: no argument name
    ('[terminal(command="ls")]', "hermes", None),
    # the same call twice in one answer runs once, whatever formats it came in
    ('<tool_call>{"name": "terminal", "arguments": {"command": "ls", "timeout": 5}}</tool_call>\n'
     '```json\n{"name": "terminal", "arguments": {"timeout": 5, "command": "ls"}}\n```', "auto",
     ("", [("terminal", {"command": "ls", "timeout": 5}, "hermes")])),
    ('<tool_call>{"name": "terminal", "arguments": {"command": "ls"}}</tool_call>'
     '<tool_call>{"name": "terminal", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>', "auto",
     ("", [("terminal", {"command": "ls"}, "hermes")])),  # once decoded, the same arguments
    ('<tool_call>{"name": "terminal", "arguments": {"command": "ls"}}</tool_call>'
     '<tool_call>{"name": "read_file", "arguments": {"command": "ls"}}</tool_call>'
     '<tool_call>{"name": "terminal", "arguments": {"command": "ls -a"}}</tool_call>', "auto",
     ("", [("terminal", {"command": "ls"}, "hermes"), ("read_file", {"command": "ls"}, "hermes"),
           ("terminal", {"command": "ls -a"}, "hermes")])),  # another name or other arguments: other calls
])
def test_each_format(text, parser, expected):
    assert _recovered(text, parser) == expected


@pytest.mark.parametrize("text", [
    'Use JSON like {"name": "terminal", "arguments": {"command": "ls"}} to call a tool.',  # inline in prose
    '```json\n{"name": "terminal", "description": "runs commands", "parameters": {}}\n```',  # a tool's schema
    '<tools>\n[{"name": "terminal", "description": "runs", "parameters": {}}]\n</tools>',  # the tool list echoed
    '```json\n{"name": "Bob", "arguments": ["a", "b"]}\n```',  # call-shaped, but no offered tool
    '{"name": "terminal"}',  # no arguments key: a record, not a call
    '```python\nprint({"name": "terminal", "arguments": {}})\n```',  # code in another language
    '[TOOL_CALLS] are how Mistral marks calls.',
    '<tool_call>',  # a cut-off answer
    '<tool_call>{"name": "terminal", "arguments": {"command": "ls"',  # cut off mid-call: not a call of its own
    '<tools><function name="terminal"/></tools>',  # a name without arguments: a record
    '<tools><function name="terminal" description="runs commands" arguments="{}"/></tools>',  # describes a tool
    '<tools><function name="terminal" arguments="{}"/><function name="nope" arguments="{}"/></tools>',  # one unoffered
    '<tools>terminal, read_file</tools>',
    '[terminal(command="ls")] and then I will read it',  # a call list inside prose
    '[1, 2, 3]',
    '',
])
def test_texts_that_are_not_calls(text):
    assert textcalls.recover(text, TOOLS, "auto") is None


def test_no_tools_offered_means_no_calls():
    assert textcalls.recover('<tool_call>{"name": "terminal", "arguments": {}}</tool_call>', [], "auto") is None


def test_native_arguments_written_as_a_string_are_decoded():
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "terminal", "arguments": json.dumps('{"command": "ls"}')}}]}
    textcalls.normalise(message, TOOLS, "auto", 0)
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"command": "ls"}
    assert textcalls.ARRIVAL_KEY not in message


def test_recovered_calls_get_the_tool_errors_native_calls_get():
    ctx = ToolContext(offered=frozenset({"terminal"}))
    found = textcalls.recover('<tool_call>{"name": "web_fetch_imaginary", "arguments": {}}</tool_call>\n'
                              '<tool_call>{"name": "terminal", "arguments": {"command": </tool_call>', TOOLS, "auto")
    unknown, broken = (json.loads(run_tool(c.name, c.arguments, ctx)) for c in found.calls)
    assert unknown["error"] == "Unknown tool: web_fetch_imaginary"
    assert broken["error"].startswith("Invalid JSON arguments")


def test_the_settings_choices_are_the_parsers():
    assert get_args(ToolCallParser) == textcalls.PARSERS
