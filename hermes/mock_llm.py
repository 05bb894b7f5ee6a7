"""A small scripted OpenAI-compatible chat server for dry runs, demos, benchmarks and tests.

No real model is needed: the server answers ``POST /v1/chat/completions`` (streaming and not)
from a script, speaks the OpenAI wire format exactly, and can inject latency and errors.

Run it::

    hermes-batch mock-llm --port 8808                 # or: python -m hermes.mock_llm --port 8808
    hermes-batch mock-llm --port 0 --latency 0.5      # port 0 picks a free port; the URL is printed

or in-process::

    with MockLLM(latency=0.1) as llm:                 # MockLLM(...).start() returns the base_url
        client = openai.OpenAI(base_url=llm.base_url, api_key="x")

Endpoints
---------
``POST /v1/chat/completions``  the model (``stream`` false or true, ``stream_options.include_usage``)
``GET  /v1/models``            one model, ``mock-model``
``GET  /health``               ``{"status": "ok"}``
``GET  /_mock/requests``       every chat request body received, in arrival order (for tests)
``GET  /_mock/stats``          call counters; ``POST /_mock/reset`` clears requests, stats, counters

What the model answers
----------------------
The server keeps no conversation state: each answer depends only on the request. Let ``u`` be
the text of the last user message with a ``MOCK_SCRIPT`` line (else the last user message),
``n`` the number of assistant messages after it in
``messages``, and ``k`` the first 8 hex characters of sha256(``u``). Tool call ids are
``call_<k>_<n>_<i>``.

1. Scripted. If a line of ``u`` contains ``MOCK_SCRIPT: {json}`` (text may precede the marker;
   the JSON must sit on that one line, as ``json.dumps`` writes it)::

       MOCK_SCRIPT: {"turns": [
           {"reasoning": "...", "content": "...",
            "tool_calls": [{"name": "terminal", "arguments": {"command": "ls"}},
                           {"name": "no_such_tool", "arguments": "{not json"}]},
           {"error": 500},
           {"sleep": 2.5, "content": "slow final answer"}]}

   assistant turn ``n`` answers ``turns[n]``; past the end the answer is ``"Done."``. Tool calls
   need not name offered tools. Object arguments are JSON-encoded; string arguments are sent
   verbatim (to test unparseable arguments). ``"error": STATUS`` fails that turn every time it
   is asked; ``"sleep": S`` waits S seconds before answering. A malformed script is a 400.

2. Default scenario, using only the offered ``tools`` (matched by function name):

   * turn 0: reasoning and two parallel calls, ``write_file`` {"path": "notes/<k>.txt",
     "content": "token <k>\\n"} and ``terminal`` {"command": "cat /etc/hostname"};
     with ``--hallucinate-rate P`` a seeded share P of conversations also calls the
     non-existent tool ``web_fetch_imaginary`` here;
   * extra middle turns when ``--turns N`` > 3: ``terminal`` {"command": "echo step <i>"};
   * next: ``read_file`` {"path": "notes/<k>.txt"};
   * finally an answer with reasoning summarising the tool results it saw, e.g.
     ``"Done. hostname=<terminal output>; notes/<k>.txt=<read_file output>"``.

   Steps whose tools are not offered are skipped; with no tools offered it answers at once.
   ``--turns N`` (default 3) is the number of model calls a conversation takes when all three
   tools are offered.

Reasoning (``--reasoning``): ``field`` (default) sends it in both ``message.reasoning`` and
``message.reasoning_content`` (``delta.*`` when streaming); ``content`` only in
``reasoning_content``; ``inline`` as ``<think>...</think>`` at the start of the content;
``scratchpad`` as ``<REASONING_SCRATCHPAD>...</REASONING_SCRATCHPAD>`` in the content; ``none``
drops it.

Errors on demand: ``--fail-first N`` fails the first N requests of each conversation (keyed by
``u``); ``--error-rate P`` fails a seeded random share of requests. Both answer
``--error-status`` (429, 500 or 503) with an OpenAI error body ``{"error": {"message", "type",
"code"}}``; 429 and 503 carry ``Retry-After`` (and ``retry-after-ms``) of ``--retry-after`` seconds.
Bad request bodies get a 400 with an OpenAI error body.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

__all__ = ["MockConfig", "MockLLM", "Reply", "ToolCall", "BadRequest", "build_reply", "main"]

MODEL_ID = "mock-model"
REASONING_MODES = ("field", "content", "inline", "scratchpad", "none")
SCRIPT_MARKER = "MOCK_SCRIPT:"
HALLUCINATED_TOOL = "web_fetch_imaginary"
STREAM_PIECE = 12          # characters per streamed content / reasoning / arguments delta
RESULT_PREVIEW = 120       # characters of a tool result quoted in the final answer


# --------------------------------------------------------------------------- configuration


@dataclass
class MockConfig:
    """Behaviour knobs; every field has a CLI option of the same name."""

    latency: float = 0.0            # seconds slept before answering each request
    latency_jitter: float = 0.0     # plus a seeded uniform 0..jitter seconds
    error_rate: float = 0.0         # seeded share of requests that fail
    fail_first: int = 0             # the first N requests of each conversation fail
    error_status: int = 500         # status of injected errors
    retry_after: float = 1.0        # Retry-After seconds on injected 429 / 503
    reasoning: str = "field"        # one of REASONING_MODES
    seed: int = 0
    turns: int = 3                  # model calls of the default scenario
    hallucinate_rate: float = 0.0   # share of conversations calling web_fetch_imaginary
    verbose: bool = False           # log each HTTP request to stderr

    def __post_init__(self) -> None:
        if self.reasoning not in REASONING_MODES:
            raise ValueError(f"reasoning must be one of {REASONING_MODES}, not {self.reasoning!r}")
        for name in ("error_rate", "hallucinate_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1")
        for name in ("latency", "latency_jitter", "retry_after", "fail_first"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if not 400 <= self.error_status <= 599:
            raise ValueError("error_status must be an HTTP error status (400-599)")
        if self.turns < 1:
            raise ValueError("turns must be at least 1")


# --------------------------------------------------------------------------- the script


class BadRequest(ValueError):
    """The request body is not a valid chat completion request (answered with 400)."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # sent verbatim, normally a JSON object


@dataclass
class Reply:
    """What the model says for one request, before the wire format is applied."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    error_status: int | None = None
    sleep: float = 0.0

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


@dataclass
class Conversation:
    """The parts of a request the script looks at."""

    messages: list[dict]
    first_user: str
    assistant_turns: int
    offered_tools: frozenset[str]

    @property
    def token(self) -> str:
        return conversation_token(self.first_user)


def conversation_token(first_user: str) -> str:
    """``k``: 8 hex characters, stable for a given first user message."""
    return hashlib.sha256(first_user.encode("utf-8")).hexdigest()[:8]


def text_of(content: Any) -> str:
    """The text of a message content: a string, or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def parse_conversation(body: Any) -> Conversation:
    """Validate a chat completion request body; raise BadRequest when it is unusable."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise BadRequest("'model' is required and must be a string")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be an array")
    # Anchor on the last user message that carries a script, else the last user message:
    # few-shot prefill before it does not shift the script, and in an unscripted chat each new
    # user message starts a new exchange.
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    scripted = [i for i in users if SCRIPT_MARKER in text_of(messages[i].get("content"))]
    last = (scripted or users or [-1])[-1]
    return Conversation(
        messages=messages,
        first_user=text_of(messages[last].get("content")) if last >= 0 else "",
        assistant_turns=sum(1 for m in messages[last + 1:] if m["role"] == "assistant"),
        offered_tools=frozenset(_tool_names(tools)),
    )


def _tool_names(tools: list) -> Iterator[str]:
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            yield function["name"]


def build_reply(body: Any, config: MockConfig) -> Reply:
    """Decide the answer to one chat request (pure: depends on the body and config only)."""
    return reply_for(parse_conversation(body), config)


def reply_for(conv: Conversation, config: MockConfig) -> Reply:
    script = find_script(conv.first_user)
    if script is not None:
        return scripted_reply(script, conv)
    return default_reply(conv, config)


# ----- scripted conversations


def find_script(first_user: str) -> dict | None:
    """The ``MOCK_SCRIPT: {json}`` line of the first user message, parsed and checked."""
    for line in first_user.splitlines():
        at = line.find(SCRIPT_MARKER)
        if at >= 0:
            return _parse_script(line[at + len(SCRIPT_MARKER):])
    return None


def _parse_script(text: str) -> dict:
    try:  # the first JSON value after the marker; anything after it on the line is ignored
        script, _ = json.JSONDecoder().raw_decode(text.strip())
    except json.JSONDecodeError as exc:
        raise BadRequest(f"invalid MOCK_SCRIPT JSON: {exc}") from None
    if not isinstance(script, dict) or not isinstance(script.get("turns"), list):
        raise BadRequest('MOCK_SCRIPT must be an object {"turns": [...]}')
    for i, turn in enumerate(script["turns"]):
        _check_turn(i, turn)
    return script


def _check_turn(i: int, turn: Any) -> None:
    if not isinstance(turn, dict):
        raise BadRequest(f"MOCK_SCRIPT turns[{i}] must be an object")
    for key in ("reasoning", "content"):
        if turn.get(key) is not None and not isinstance(turn[key], str):
            raise BadRequest(f"MOCK_SCRIPT turns[{i}].{key} must be a string")
    calls = turn.get("tool_calls") or []
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
        raise BadRequest(f"MOCK_SCRIPT turns[{i}].tool_calls must be a list of {{'name': str, 'arguments': ...}}")
    error = turn.get("error")
    if error is not None and not (isinstance(error, int) and 400 <= error <= 599):
        raise BadRequest(f"MOCK_SCRIPT turns[{i}].error must be an HTTP status 400-599")
    sleep = turn.get("sleep", 0)
    if not isinstance(sleep, (int, float)) or sleep < 0:
        raise BadRequest(f"MOCK_SCRIPT turns[{i}].sleep must be a non-negative number")


def scripted_reply(script: dict, conv: Conversation) -> Reply:
    n = conv.assistant_turns
    if n >= len(script["turns"]):
        return Reply(content="Done.")
    turn = script["turns"][n]
    calls = [
        ToolCall(_call_id(conv.token, n, i), c["name"], _encode_arguments(c.get("arguments", {})))
        for i, c in enumerate(turn.get("tool_calls") or [])
    ]
    content = turn.get("content")
    return Reply(
        content=content if content is not None or calls else "",
        reasoning=turn.get("reasoning"),
        tool_calls=calls,
        error_status=turn.get("error"),
        sleep=float(turn.get("sleep", 0)),
    )


def _encode_arguments(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _call_id(token: str, n: int, i: int) -> str:
    return f"call_{token}_{n}_{i}"


# ----- the default scenario


def default_reply(conv: Conversation, config: MockConfig) -> Reply:
    steps = default_plan(conv, config)
    n = conv.assistant_turns
    if n >= len(steps):
        return final_reply(conv)
    calls = [ToolCall(_call_id(conv.token, n, i), name, json.dumps(args)) for i, (name, args) in enumerate(steps[n])]
    return Reply(reasoning=_step_reasoning(conv, n, calls), tool_calls=calls)


def default_plan(conv: Conversation, config: MockConfig) -> list[list[tuple[str, dict]]]:
    """The tool-call turns of the default scenario: a list of turns, each a list of (name, args)."""
    offered, k = conv.offered_tools, conv.token
    if not offered:
        return []
    first: list[tuple[str, dict]] = []
    if "write_file" in offered:
        first.append(("write_file", {"path": f"notes/{k}.txt", "content": f"token {k}\n"}))
    if "terminal" in offered:
        first.append(("terminal", {"command": "cat /etc/hostname"}))
    if _hallucinates(conv.first_user, config):
        first.append((HALLUCINATED_TOOL, {"url": f"https://example.invalid/{k}"}))
    middle = []
    if "terminal" in offered:
        middle = [[("terminal", {"command": f"echo step {i}"})] for i in range(1, config.turns - 2)]
    last = [("read_file", {"path": f"notes/{k}.txt"})] if "read_file" in offered else []
    steps = [step for step in (first, *middle, last) if step]
    return steps[: config.turns - 1]


def _hallucinates(first_user: str, config: MockConfig) -> bool:
    if config.hallucinate_rate <= 0:
        return False
    digest = hashlib.sha256(f"{config.seed}:{first_user}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < config.hallucinate_rate


def _step_reasoning(conv: Conversation, n: int, calls: list[ToolCall]) -> str:
    names = ", ".join(c.name for c in calls)
    if n == 0:
        task = " ".join(conv.first_user.split())[:80]
        return f"The task is: {task!r}. I will start with {names}, in parallel where I can."
    return f"Step {n}: the previous results are in; next I call {names}."


def final_reply(conv: Conversation) -> Reply:
    """The closing answer, quoting the tool results found in the conversation."""
    results = tool_results(conv.messages)
    facts = []
    for name, args, output in results:
        if name == "terminal" and args.get("command") == "cat /etc/hostname":
            facts.append(f"hostname={output}")
        elif name == "read_file":
            facts.append(f"{args.get('path', 'file')}={output}")
    content = "Done." + (" " + "; ".join(facts) if facts else "")
    if results:
        seen = ", ".join(name for name, _, _ in results)
        reasoning = f"I saw {len(results)} tool result(s) ({seen}); time to summarise."
    else:
        reasoning = "No tools are needed for this; I can answer directly."
    return Reply(content=content, reasoning=reasoning)


def tool_results(messages: list[dict]) -> list[tuple[str, dict, str]]:
    """(tool name, parsed arguments, short output) for each tool message, in order."""
    calls: dict[str, tuple[str, dict]] = {}
    for message in messages:
        if message["role"] == "assistant":
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    function = call["function"]
                    calls[str(call.get("id"))] = (str(function.get("name")), _loads_object(function.get("arguments")))
    results = []
    for message in messages:
        if message["role"] == "tool":
            name, args = calls.get(str(message.get("tool_call_id")), ("unknown", {}))
            results.append((name, args, _preview(text_of(message.get("content")))))
    return results


def _loads_object(text: Any) -> dict:
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _preview(output: str) -> str:
    """A tool result's gist: the ``output``/``content`` of a JSON result, first line, trimmed."""
    parsed = _loads_object(output)
    for key in ("output", "content", "stdout", "result"):
        if isinstance(parsed.get(key), str):
            output = parsed[key]
            break
    lines = output.strip().splitlines()
    return (lines[0] if lines else "")[:RESULT_PREVIEW]


# --------------------------------------------------------------------------- wire format


def render_text(reply: Reply, mode: str) -> tuple[str | None, dict[str, str]]:
    """(content, reasoning fields) for a reply under a reasoning mode."""
    reasoning, content = reply.reasoning, reply.content
    if not reasoning or mode == "none":
        return content, {}
    if mode == "field":
        return content, {"reasoning": reasoning, "reasoning_content": reasoning}
    if mode == "content":
        return content, {"reasoning_content": reasoning}
    tag = "think" if mode == "inline" else "REASONING_SCRATCHPAD"
    block = f"<{tag}>{reasoning}</{tag}>"
    return (f"{block}\n{content}" if content else block), {}


def usage_of(body: dict, reply: Reply) -> dict[str, int]:
    """Rough token counts: characters / 4."""
    prompt = len(json.dumps(body.get("messages", []))) + len(json.dumps(body.get("tools") or []))
    completion = len(reply.content or "") + len(reply.reasoning or "")
    completion += sum(len(c.name) + len(c.arguments) for c in reply.tool_calls)
    prompt_tokens, completion_tokens = max(1, prompt // 4), max(1, completion // 4)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _envelope(kind: str, model: str, completion_id: str, created: int) -> dict:
    return {"id": completion_id, "object": kind, "created": created, "model": model, "system_fingerprint": "mock"}


def completion_object(body: dict, reply: Reply, mode: str) -> dict:
    """A non-streaming ``chat.completion``."""
    content, reasoning_fields = render_text(reply, mode)
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, **reasoning_fields}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    return {
        **_envelope("chat.completion", body["model"], _completion_id(), int(time.time())),
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason}],
        "usage": usage_of(body, reply),
    }


def completion_chunks(body: dict, reply: Reply, mode: str) -> Iterator[dict]:
    """The ``chat.completion.chunk`` objects of a streamed answer (without ``[DONE]``)."""
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    envelope = _envelope("chat.completion.chunk", body["model"], _completion_id(), int(time.time()))

    def chunk(delta: dict, finish_reason: str | None = None) -> dict:
        out = {**envelope, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
        if include_usage:
            out["usage"] = None
        return out

    content, reasoning_fields = render_text(reply, mode)
    yield chunk({"role": "assistant"})
    for piece in _pieces(reply.reasoning or "") if reasoning_fields else ():
        yield chunk({key: piece for key in reasoning_fields})  # both fields in one delta, like OpenRouter
    for piece in _pieces(content or ""):
        yield chunk({"content": piece})
    for i, call in enumerate(reply.tool_calls):
        yield chunk({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                     "function": {"name": call.name, "arguments": ""}}]})
        for piece in _pieces(call.arguments):
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    yield chunk({}, reply.finish_reason)
    if include_usage:
        yield {**envelope, "choices": [], "usage": usage_of(body, reply)}


def _pieces(text: str) -> list[str]:
    return [text[i:i + STREAM_PIECE] for i in range(0, len(text), STREAM_PIECE)]


def _completion_id() -> str:
    return f"chatcmpl-mock{uuid.uuid4().hex[:20]}"


ERROR_KINDS = {
    400: ("invalid_request_error", "invalid_request"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", "server_error"),
    503: ("server_error", "service_unavailable"),
}


def error_body(status: int, message: str) -> dict:
    """An OpenAI-style error body."""
    kind, code = ERROR_KINDS.get(status, ("server_error" if status >= 500 else "invalid_request_error", str(status)))
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# --------------------------------------------------------------------------- server state


class MockState:
    """What the server remembers: received requests, counters, fail-first tallies, the RNG."""

    def __init__(self, config: MockConfig):
        self.config = config
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.requests: list[Any] = []
            self.counts = {"requests": 0, "ok": 0, "errors": 0, "injected_errors": 0,
                           "bad_requests": 0, "streamed": 0, "in_flight": 0, "max_in_flight": 0}
            self._attempts: dict[str, int] = {}
            self._rng = random.Random(self.config.seed)

    def record(self, body: Any) -> None:
        with self._lock:
            self.requests.append(body)

    def count(self, key: str, delta: int = 1) -> None:
        with self._lock:
            self.counts[key] += delta
            if key == "in_flight":
                self.counts["max_in_flight"] = max(self.counts["max_in_flight"], self.counts["in_flight"])

    def snapshot(self) -> tuple[list[Any], dict[str, int]]:
        with self._lock:
            return list(self.requests), dict(self.counts)

    def latency(self) -> float:
        config = self.config
        if not config.latency_jitter:
            return config.latency
        with self._lock:
            return config.latency + self._rng.uniform(0, config.latency_jitter)

    def injected_error(self, conversation_key: str) -> bool:
        """Should this request fail on purpose (--fail-first, then --error-rate)?"""
        config = self.config
        with self._lock:
            if config.fail_first:
                seen = self._attempts.get(conversation_key, 0)
                self._attempts[conversation_key] = seen + 1
                if seen < config.fail_first:
                    return True
            return config.error_rate > 0 and self._rng.random() < config.error_rate


# --------------------------------------------------------------------------- HTTP


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512      # many concurrent clients connect at once
    state: MockState

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # clients hanging up is normal
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive, so client connection pools work
    server_version = "hermes-mock-llm/1"
    timeout = 120                   # idle keep-alive connections are dropped after this
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid 40 ms delayed-ACK stalls
    server: _Server

    # ----- routing

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            self._send_json(200, {"status": "ok"})
        elif path in ("/v1/models", "/models"):
            self._send_json(200, {"object": "list", "data": [
                {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "hermes-batch"}]})
        elif path == "/_mock/requests":
            self._send_json(200, self.server.state.snapshot()[0])
        elif path == "/_mock/stats":
            self._send_json(200, self.server.state.snapshot()[1])
        elif path in ("/v1/chat/completions", "/chat/completions", "/_mock/reset"):
            self._send_error(405, f"use POST for {path}")
        else:
            self._send_error(404, f"no route for GET {path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/v1/chat/completions", "/chat/completions"):
            self._guarded(self._chat)
        elif path == "/_mock/reset":
            self._read_body()
            self.server.state.reset()
            self._send_json(200, {"status": "reset"})
        else:
            self._read_body()
            self._send_error(404, f"no route for POST {path}")

    # ----- chat completions

    def _guarded(self, handler) -> None:
        state = self.server.state
        state.count("in_flight")
        try:
            handler()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug in the mock must not kill the connection silently
            state.count("errors")
            self.close_connection = True
            try:
                self._send_error(500, f"mock server error: {type(exc).__name__}: {exc}")
            except OSError:
                pass
        finally:
            state.count("in_flight", -1)

    def _chat(self) -> None:
        state = self.server.state
        state.count("requests")
        try:
            body = json.loads(self._read_body() or b"null")
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return self._bad_request(f"request body is not valid JSON: {exc}")
        state.record(body)
        try:
            conv = parse_conversation(body)
            reply = reply_for(conv, state.config)
        except BadRequest as exc:
            return self._bad_request(str(exc))
        time.sleep(state.latency() + reply.sleep)
        if state.injected_error(conv.first_user):
            state.count("injected_errors")
            return self._fail(state.config.error_status, "injected failure (mock-llm --fail-first / --error-rate)")
        if reply.error_status:
            return self._fail(reply.error_status, f"scripted failure of turn (MOCK_SCRIPT error {reply.error_status})")
        state.count("ok")
        if body.get("stream"):
            state.count("streamed")
            self._send_stream(completion_chunks(body, reply, state.config.reasoning))
        else:
            self._send_json(200, completion_object(body, reply, state.config.reasoning))

    def _bad_request(self, message: str) -> None:
        self.server.state.count("bad_requests")
        self._fail(400, message)

    def _fail(self, status: int, message: str) -> None:
        self.server.state.count("errors")
        headers = {}
        if status in (429, 503):
            seconds = self.server.state.config.retry_after
            headers = {"Retry-After": _format_seconds(seconds), "retry-after-ms": str(int(seconds * 1000))}
        self._send_error(status, message, headers)

    # ----- I/O

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True  # not supported; the unread body would corrupt keep-alive
            return b""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            return b""
        return self.rfile.read(length) if length > 0 else b""

    def _send_error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self._send_json(status, error_body(status, message), headers)

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", f"req_mock{uuid.uuid4().hex[:16]}")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, chunks: Iterator[dict]) -> None:
        """Server-sent events over chunked transfer encoding (so keep-alive still works)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in chunks:
            self._write_chunk(f"data: {json.dumps(chunk)}\n\n".encode("utf-8"))
        self._write_chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode("ascii") + data + b"\r\n")

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.state.config.verbose:
            super().log_message(format, *args)


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


# --------------------------------------------------------------------------- in-process API


class MockLLM:
    """The mock server, in a background thread.

    ``MockLLM(port=0, host="127.0.0.1", **MockConfig fields)``; ``start()`` returns the base_url
    (``http://HOST:PORT/v1``), ``stop()`` shuts it down; as a context manager it yields itself
    started. ``requests()``, ``stats()`` and ``reset()`` mirror the ``/_mock/*`` endpoints.
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", config: MockConfig | None = None, **options: Any):
        if config is not None and options:
            raise TypeError("pass either config or keyword options, not both")
        self.config = config or MockConfig(**options)
        self.host, self.port = host, port
        self.state = MockState(self.config)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Root URL of the server (``/health``, ``/_mock/*`` live here)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base_url: ``http://HOST:PORT/v1``."""
        return f"{self.url}/v1"

    def start(self) -> str:
        if self._server is not None:
            return self.base_url
        server = _Server((self.host, self.port), _Handler)
        server.state = self.state
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"mock-llm:{self.port}", daemon=True)
        self._thread.start()
        return self.base_url

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def requests(self) -> list[Any]:
        return self.state.snapshot()[0]

    def stats(self) -> dict[str, int]:
        return self.state.snapshot()[1]

    def reset(self) -> None:
        self.state.reset()

    def __enter__(self) -> "MockLLM":
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hermes-batch mock-llm",
        description="Serve a scripted OpenAI-compatible chat model (see `python -m pydoc hermes.mock_llm`).",
    )
    add = parser.add_argument
    add("--port", type=int, default=0, help="port to listen on (0 = any free port; the URL is printed)")
    add("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    add("--latency", type=float, default=0.0, metavar="S", help="seconds to sleep before each answer")
    add("--latency-jitter", type=float, default=0.0, metavar="S", help="plus a random 0..S seconds")
    add("--error-rate", type=float, default=0.0, metavar="P", help="share of requests that fail (seeded)")
    add("--fail-first", type=int, default=0, metavar="N", help="the first N requests of each conversation fail")
    add("--error-status", type=int, default=500, choices=(429, 500, 503), help="status of injected errors")
    add("--retry-after", type=float, default=1.0, metavar="S", help="Retry-After seconds on 429/503")
    add("--reasoning", default="field", choices=REASONING_MODES, help="how reasoning is sent (default field)")
    add("--seed", type=int, default=0, help="seed for --error-rate, --latency-jitter, --hallucinate-rate")
    add("--turns", type=int, default=3, metavar="N", help="model calls per prompt in the default scenario")
    add("--hallucinate-rate", type=float, default=0.0, metavar="P",
        help=f"share of conversations that also call the unknown tool {HALLUCINATED_TOOL}")
    add("--verbose", action="store_true", help="log every HTTP request to stderr")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    options = {k: v for k, v in vars(args).items() if k not in ("port", "host")}
    try:
        llm = MockLLM(port=args.port, host=args.host, **options)
        base_url = llm.start()
    except (ValueError, OSError) as exc:
        print(f"mock-llm: {exc}", file=sys.stderr)
        return 2
    print(f"mock-llm listening on {base_url}", flush=True)
    stopping = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        while not stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        llm.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
