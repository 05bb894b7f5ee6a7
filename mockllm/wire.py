"""The OpenAI wire format of a reply: completion objects, stream chunks, error bodies."""
from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

import orjson

from mockllm.conversation import STREAM_PIECE, Reply

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
    prompt = len(orjson.dumps(body.get("messages", []))) + len(orjson.dumps(body.get("tools") or []))
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

