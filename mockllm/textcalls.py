"""``--tool-calls``: the scripted calls written as text in the answer, as open models write them when
their server has no tool parser (vLLM or SGLang without ``--tool-call-parser``, llama.cpp with the
model's own template), or not made at all.

    native       the OpenAI ``tool_calls`` field (the default)
    hermes       ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` per call (Hermes, Qwen2.5)
    json         a fenced ```json block per call, ``{"name": ..., "arguments": {...}}`` (coder models)
    llama        Llama 3.x: the answer is ``{"name": ..., "parameters": {...}}`` objects joined by ``; ``,
                 or ``<function=NAME>{...}</function>`` per call when the turn also has text
    mistral      ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``
    qwen3_coder  ``<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>...</function>\\n</tool_call>``
    never        no call at all: prose saying what the model would do (a model that explains instead of acting)

The turn's own text comes first, the calls after it, on lines of their own.
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Callable

from mockllm.conversation import TOOL_CALL_MODES, Reply, ToolCall  # noqa: F401  (the modes, listed there)


def _args(call: ToolCall) -> Any:
    """The call's arguments as a value when they are JSON; else None (the raw text is written instead)."""
    try:
        return json.loads(call.arguments)
    except ValueError:
        return None


def _object(call: ToolCall, key: str = "arguments") -> str:
    args = _args(call)
    if args is None:  # scripted unparseable arguments stay unparseable in the text
        return '{"name": %s, "%s": %s}' % (json.dumps(call.name), key, call.arguments)
    return json.dumps({"name": call.name, key: args}, ensure_ascii=False)


def _hermes(calls: list[ToolCall], text: str) -> str:
    return "\n".join(f"<tool_call>\n{_object(c)}\n</tool_call>" for c in calls)


def _json(calls: list[ToolCall], text: str) -> str:
    return "\n".join(f"```json\n{_object(c)}\n```" for c in calls)


def _llama(calls: list[ToolCall], text: str) -> str:
    if text:
        return "\n".join(f"<function={c.name}>{c.arguments}</function>" for c in calls)
    return "; ".join(_object(c, "parameters") for c in calls)


def _mistral(calls: list[ToolCall], text: str) -> str:
    return "[TOOL_CALLS][" + ", ".join(_object(c) for c in calls) + "]"


def _qwen3_coder(calls: list[ToolCall], text: str) -> str:
    def value(v: Any) -> str:
        return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)

    blocks = []
    for c in calls:
        args = _args(c)
        params = "".join(f"<parameter={k}>\n{value(v)}\n</parameter>\n" for k, v in (args or {}).items()) \
            if isinstance(args, dict) else f"{c.arguments}\n"
        blocks.append(f"<tool_call>\n<function={c.name}>\n{params}</function>\n</tool_call>")
    return "\n".join(blocks)


def _never(calls: list[ToolCall], text: str) -> str:
    steps = ", then ".join(f"use {c.name} with {c.arguments}" for c in calls)
    return f"To do this I would {steps}. You can run these steps yourself."


WRITERS: dict[str, Callable[[list[ToolCall], str], str]] = {
    "hermes": _hermes, "json": _json, "llama": _llama, "mistral": _mistral, "qwen3_coder": _qwen3_coder,
    "never": _never,
}


def as_text(reply: Reply, mode: str) -> Reply:
    """The reply with its tool calls written into its content in `mode` (native: unchanged)."""
    if mode == "native" or not reply.tool_calls:
        return reply
    text = reply.content or ""
    written = WRITERS[mode](reply.tool_calls, text)
    return replace(reply, content=f"{text}\n{written}" if text else written, tool_calls=[])
