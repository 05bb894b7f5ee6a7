"""API-format chat messages -> ShareGPT turns (SPEC section 2, seed 001).

Input is the OpenAI chat-completions message list an agent loop keeps; output is
``[{"from": "system"|"human"|"gpt"|"tool", "value": str}, ...]``, starting with a
generated system turn (the Hermes function-calling template).

Reasoning, whatever its source, ends up in exactly ONE ``<think>`` block at the start of
every gpt turn (see ``split_reasoning`` for how native and inline reasoning combine).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Iterator

import orjson

logger = logging.getLogger(__name__)

# Copied character for character from seed 001's example system turn; only the tool list varies.
_SYSTEM_HEAD = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools> </tools> XML tags. You may call one or more functions to assist with the user "
    "query. If available tools are not relevant in assisting with user query, just respond in "
    "natural conversational language. Don't make assumptions about what values to plug into "
    "functions. After calling & executing the functions, you will be provided with function "
    "results within <tool_response> </tool_response> XML tags. Here are the available tools:\n"
)
_SYSTEM_TAIL = (
    "For each function call return a JSON object, with the following pydantic model json "
    "schema for each:\n"
    "{'title': 'FunctionCall', 'type': 'object', 'properties': {'name': {'title': 'Name', "
    "'type': 'string'}, 'arguments': {'title': 'Arguments', 'type': 'object'}}, "
    "'required': ['name', 'arguments']}\n"
    "Each function call should be enclosed within <tool_call> </tool_call> XML tags.\n"
    "Example:\n<tool_call>\n{'name': <function-name>,'arguments': <args-dict>}\n</tool_call>"
)

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_IMAGE_PARTS = {"image_url", "image", "input_image"}


# --------------------------------------------------------------------------- system turn

def _tool_function(tool: dict) -> dict:
    # Accept both the OpenAI wrapper {"type": "function", "function": {...}} and a bare function.
    return tool["function"] if isinstance(tool.get("function"), dict) else tool


#: generated system turns by their tools' JSON: a run offers a handful of tool sets, and making the
#: turn again for each prompt was a few percent of the loop's time at 512 prompts in flight
_SYSTEM_TURNS: dict[bytes, str] = {}
_SYSTEM_TURNS_KEPT = 256


def system_prompt(tools: list[dict]) -> str:
    """The generated system turn: seed 001's template with a ``<tools>`` JSON list."""
    try:
        key = orjson.dumps(tools)
    except TypeError:  # what orjson cannot encode is made each time
        return _system_prompt(tools)
    turn = _SYSTEM_TURNS.get(key)
    if turn is None:
        if len(_SYSTEM_TURNS) >= _SYSTEM_TURNS_KEPT:
            _SYSTEM_TURNS.clear()
        turn = _SYSTEM_TURNS[key] = _system_prompt(tools)
    return turn


def _system_prompt(tools: list[dict]) -> str:
    listed = []
    for tool in tools or []:
        fn = _tool_function(tool)
        listed.append({
            "name": fn["name"],
            "description": fn.get("description", ""),
            "parameters": fn.get("parameters", {}),
            "required": None,  # the template's canonical form always carries a null here
        })
    tools_json = json.dumps(listed, ensure_ascii=False)
    return f"{_SYSTEM_HEAD}<tools>\n{tools_json}\n</tools>\n{_SYSTEM_TAIL}"


# --------------------------------------------------------------------------- text helpers

def content_text(content: Any) -> str:
    """Flatten message content (str, None or a list of parts) to text.

    Text parts are joined with "\\n"; image parts become the placeholder ``[image]`` (a
    trajectory is text-only, and base64 images would bloat every line); any other part
    type becomes ``[<type>]`` so the reader still sees that something was there.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif not isinstance(part, dict):
                continue
            elif part.get("type") in ("text", "input_text", "output_text"):
                texts.append(part.get("text") or "")
            elif part.get("type") in _IMAGE_PARTS:
                texts.append("[image]")
            else:
                texts.append(f"[{part.get('type', 'unknown')}]")
        return "\n".join(texts)
    return str(content)


def _scratchpad_to_think(text: str) -> str:
    return text.replace("<REASONING_SCRATCHPAD>", _THINK_OPEN).replace(
        "</REASONING_SCRATCHPAD>", _THINK_CLOSE)


def split_reasoning(message: dict) -> tuple[str, str]:
    """Return ``(reasoning, content)`` of an assistant message, both stripped.

    Sources of reasoning, in order: the native ``reasoning`` field (``reasoning_content``
    when ``reasoning`` is empty; never both), then every inline block in the content
    (``<REASONING_SCRATCHPAD>`` is first renamed to ``<think>``). Inline blocks are cut
    out of the content wherever they appear, so the result has a single think block at
    the start. Decision for "native AND inline": keep both texts, native first, but
    drop an inline piece identical to one already taken (providers that echo the
    reasoning into the content would otherwise duplicate it); nothing the model
    reasoned is lost and there is still exactly one block.

    Broken markup, seen with truncated or template-prefilled outputs:
    - an unclosed ``<think>``: everything after it is reasoning (the answer never came);
    - a ``</think>`` with no opening before it (the chat template prefilled ``<think>``):
      everything before it is reasoning.
    """
    native = (message.get("reasoning") or "").strip() or (
        message.get("reasoning_content") or "").strip()
    text = _scratchpad_to_think(content_text(message.get("content")))
    pieces = [native]

    close, open_ = text.find(_THINK_CLOSE), text.find(_THINK_OPEN)
    if close != -1 and (open_ == -1 or close < open_):
        pieces.append(text[:close])
        text = text[close + len(_THINK_CLOSE):]

    pieces.extend(m.group(1) for m in _THINK_BLOCK.finditer(text))
    text = _THINK_BLOCK.sub("", text)

    open_ = text.find(_THINK_OPEN)
    if open_ != -1:
        pieces.append(text[open_ + len(_THINK_OPEN):])
        text = text[:open_]

    unique: list[str] = []
    for piece in (p.strip() for p in pieces):
        if piece and piece not in unique:
            unique.append(piece)
    return "\n".join(unique), text.strip()


# --------------------------------------------------------------------------- gpt turns

def parse_arguments(arguments: Any, name: str = "?") -> dict:
    """Tool-call arguments as an object; ``{}`` (with a warning) when they do not parse.

    An empty string means "no arguments" (some providers send it for argument-less
    tools), so it gives ``{}`` without a warning. JSON that parses to a non-object is
    treated as unparseable: the FunctionCall schema says arguments is an object.
    """
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    try:
        parsed = json.loads(arguments)
    except (TypeError, ValueError):
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    logger.warning("tool call %s: arguments are not a JSON object, using {}: %.100r",
                   name, arguments)
    return {}


def _tool_call_block(call: dict) -> str:
    fn = call.get("function") or {}
    name = fn.get("name", "")
    body = {"name": name, "arguments": parse_arguments(fn.get("arguments"), name)}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


def _calls(message: dict) -> list[dict]:
    return [c for c in (message.get("tool_calls") or []) if isinstance(c, dict)]


def format_assistant(message: dict) -> str:
    """One assistant message -> one gpt value: think block, content, tool_call blocks.

    Layout (seed 001): ``<think>\\n{reasoning}\\n</think>\\n`` (or ``<think>\\n</think>\\n``),
    then the content, then the tool_call blocks, content and blocks joined by "\\n".
    The whole value is right-stripped, as in the seed (no trailing newline).
    """
    reasoning, content = split_reasoning(message)
    think = f"<think>\n{reasoning}\n</think>\n" if reasoning else "<think>\n</think>\n"
    body = [content] if content else []
    body.extend(_tool_call_block(call) for call in _calls(message))
    return (think + "\n".join(body)).rstrip()


# --------------------------------------------------------------------------- tool turns

def name_tool_results(assistant: dict | None, results: list[dict]) -> list[tuple[str, dict]]:
    """Pair each tool message of one group with its tool name, in the assistant's call order.

    Names come from the call with the same ``tool_call_id`` (deliberately: the reference
    matches by position, which mislabels results that arrive out of order); failing that,
    the message's own ``name``; failing that, the call at the same position; else
    "unknown". Results without a matching id keep their arrival order, after the others.
    """
    calls = _calls(assistant or {})
    index_of = {c.get("id"): i for i, c in enumerate(calls) if c.get("id")}
    named = []
    for pos, msg in enumerate(results):
        i = index_of.get(msg.get("tool_call_id"))
        if i is not None:
            name = (calls[i].get("function") or {}).get("name", "unknown")
        elif msg.get("name"):
            name = msg["name"]
        elif pos < len(calls):
            name = (calls[pos].get("function") or {}).get("name", "unknown")
        else:
            name = "unknown"
        order = i if i is not None else len(calls) + pos
        named.append((order, name, msg))
    named.sort(key=lambda item: item[0])  # stable: unmatched keep arrival order
    return [(name, msg) for _, name, msg in named]


def _segments(messages: list[dict]) -> Iterator[tuple[dict | None, list[dict]]]:
    """(message, tool messages that directly follow it) for every non-tool message.

    Tool messages before any other message (a truncated history) come as ``(None, group)``.
    """
    current, group = None, []
    for msg in messages:
        if msg.get("role") == "tool":
            group.append(msg)
            continue
        if current is not None or group:
            yield current, group
        current, group = msg, []
    if current is not None or group:
        yield current, group


def _caller(msg: dict | None) -> dict | None:
    # Only an assistant message can have made the calls its following tool messages answer.
    return msg if msg is not None and msg.get("role") == "assistant" else None


def tool_results(messages: list[dict]) -> Iterator[tuple[str, dict]]:
    """Every tool message of a conversation with its tool name (same rule as the tool turns)."""
    for msg, group in _segments(messages):
        if group:
            yield from name_tool_results(_caller(msg), group)


def _result_content(content: Any) -> Any:
    text = content_text(content)
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except ValueError:
            pass  # looked like JSON but is not: keep the text as it is
    return text


def format_tool_results(assistant: dict | None, results: list[dict]) -> str:
    """All tool messages after one assistant message -> one tool value."""
    blocks = []
    for name, msg in name_tool_results(assistant, results):
        body = {"tool_call_id": msg.get("tool_call_id", ""), "name": name,
                "content": _result_content(msg.get("content"))}
        blocks.append(f"<tool_response>\n{json.dumps(body, ensure_ascii=False)}\n</tool_response>")
    return "\n".join(blocks)


# --------------------------------------------------------------------------- whole conversation

def to_sharegpt(messages: list[dict], tools: list[dict]) -> list[dict]:
    """API-format messages -> ShareGPT turns, starting with the generated system turn.

    ``system``/``developer`` messages are skipped: the system turn is generated, and the
    run's own (ephemeral) system prompt must never be saved. Unknown roles are skipped
    with a warning rather than guessed at.
    """
    turns = [{"from": "system", "value": system_prompt(tools)}]
    for msg, group in _segments(messages):
        role = msg.get("role") if msg is not None else None
        if role == "user":
            turns.append({"from": "human", "value": content_text(msg.get("content"))})
        elif role == "assistant":
            turns.append({"from": "gpt", "value": format_assistant(msg)})
        elif role is not None and role not in ("system", "developer"):
            logger.warning("skipping message with unknown role %r", role)
        if group:
            turns.append({"from": "tool", "value": format_tool_results(_caller(msg), group)})
    return turns
