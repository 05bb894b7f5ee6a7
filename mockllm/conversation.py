"""The parts of a chat request the mock looks at, its knobs, and the reply it decides on."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

MODEL_ID = "mock-model"
REASONING_MODES = ("field", "content", "inline", "scratchpad", "none")
#: --tool-calls: the OpenAI field, or the calls written as text in a model family's format (mockllm.textcalls)
TOOL_CALL_MODES = ("native", "hermes", "json", "llama", "mistral", "qwen3_coder", "never")
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
    rpm: float = 0.0                # requests a minute before 429 (0: no cap), see mockllm.ratelimit
    burst: int = 0                  # most requests the cap takes at once (0: one second's worth)
    ratelimit_headers: bool = True  # send x-ratelimit-* headers (some endpoints send only Retry-After)
    verbose: bool = False           # log each HTTP request to stderr
    tool_calls: str = "native"      # how calls are sent: native, or written as text (mockllm.textcalls)

    def __post_init__(self) -> None:
        if self.tool_calls not in TOOL_CALL_MODES:
            raise ValueError(f"tool_calls must be one of {TOOL_CALL_MODES}, not {self.tool_calls!r}")
        if self.reasoning not in REASONING_MODES:
            raise ValueError(f"reasoning must be one of {REASONING_MODES}, not {self.reasoning!r}")
        for name in ("error_rate", "hallucinate_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1")
        for name in ("latency", "latency_jitter", "retry_after", "fail_first", "rpm", "burst"):
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
    error_times: int | None = None  # the error is answered the first N times this turn is asked (None: always)
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
    seed: int | None = None  # the request's ``seed`` (hermes --sampling_seed sends one per attempt and turn)
    #: the server's visit counter: the how-manieth conversation opening with this first user message
    #: this one is (mockllm.branches); None in a pure build_reply, where every conversation is the first
    visits: Callable[[str], int] | None = None

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
        seed=body["seed"] if isinstance(body.get("seed"), int) and not isinstance(body.get("seed"), bool) else None,
    )


def _tool_names(tools: list) -> Iterator[str]:
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            yield function["name"]

