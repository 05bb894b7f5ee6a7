"""Client input -> the agent's chat messages, refusing what the agent cannot take.

Images (http(s) URLs and data:image/... URLs) pass through to the model as they are; uploaded
files (`file`, `input_file`, `file_id`) and non-image data: URLs are refused with
400 `unsupported_content_type`, naming the offending part.
"""
from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, model_validator

from hermes.api.errors import ApiError

UNSUPPORTED = "unsupported_content_type"
FILE_TYPES = ("file", "input_file")
CHAT_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")


def unsupported(message: str, param: str) -> ApiError:
    return ApiError(400, message, UNSUPPORTED, param)


def bad(message: str, param: str | None) -> ApiError:
    return ApiError(400, message, "invalid_request", param)


def lone_surrogate_at(value: Any, param: str = "") -> str | None:
    """Where in a parsed JSON body a string holds a lone UTF-16 surrogate (JSON allows the
    escape \\ud800, Unicode text does not): the parameter path, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return param or "body"
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            where = lone_surrogate_at(k, param or "body") or lone_surrogate_at(v, f"{param}.{k}" if param else str(k))
            if where:
                return where
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if where := lone_surrogate_at(v, f"{param}[{i}]"):
                return where
    return None


class TextOnly(BaseModel):
    """A request body whose strings must be Unicode text: one with a lone surrogate is the
    client's bad input (400 naming the field), not something to fail on later when the text
    is encoded for the model, the store or the answer."""

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        if where := lone_surrogate_at(data):
            # ApiError, not ValueError: pydantic lets it through to the handler, param and all
            raise bad(f"{where}: text holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not valid Unicode",
                      where)
        return data


def check_image_url(url: Any, param: str) -> str:
    if not isinstance(url, str) or not url:
        raise bad("an image part needs a URL string", param)
    lower = url[:64].lower()
    if lower.startswith("data:"):
        if not lower.startswith("data:image/"):
            media = lower[5:].split(";", 1)[0].split(",", 1)[0] or "unknown"
            raise unsupported(f"data: URLs must hold an image, not {media}; file inputs are not supported", param)
        return url
    if lower.startswith(("http://", "https://")):
        return url
    raise bad("image URLs must be http(s):// or data:image/... URLs", param)


def _part_type(part: Any, param: str) -> str:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise bad("each content part must be an object with a string 'type'", param)
    if "file_id" in part or part["type"] in FILE_TYPES:
        raise unsupported(f"file inputs ({part['type']}) are not supported: send text or images", f"{param}.type")
    return part["type"]


def chat_parts(parts: list[Any], param: str) -> list[dict[str, Any]]:
    """Chat Completions content parts: text and image_url."""
    out = []
    for j, part in enumerate(parts):
        p = f"{param}[{j}]"
        kind = _part_type(part, p)
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise bad("a text part needs a string 'text'", f"{p}.text")
            out.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if isinstance(image, dict) and "file_id" in image:
                raise unsupported("file inputs (file_id) are not supported: send text or images", f"{p}.image_url")
            check_image_url(url, f"{p}.image_url")
            out.append(part)
        else:
            raise unsupported(f"content parts of type '{kind}' are not supported: send text or images", f"{p}.type")
    return out


def chat_messages(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """(conversation for the agent, the client's system text) from Chat Completions messages."""
    conversation, system = [], []
    for i, m in enumerate(messages):
        role, content = m["role"], m.get("content")
        param = f"messages[{i}].content"
        if isinstance(content, list):
            content = chat_parts(content, param)
        if role in ("system", "developer"):
            text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content or [])
            system.append(text)
            continue
        # only the fields every OpenAI-compatible model takes: strict endpoints refuse others
        message = {k: m[k] for k in CHAT_FIELDS if m.get(k) is not None}
        message["content"] = content
        if role in ("user", "tool") and content is None:
            raise bad(f"a {role} message needs content", param)
        if role == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise bad("a tool message needs a string 'tool_call_id'", f"messages[{i}].tool_call_id")
        if m.get("tool_calls") is not None:
            if role != "assistant":
                raise bad("only assistant messages have tool_calls", f"messages[{i}].tool_calls")
            _check_tool_calls(m["tool_calls"], f"messages[{i}].tool_calls")
        if m.get("tool_call_id") is not None and role != "tool":
            raise bad("only tool messages have a tool_call_id", f"messages[{i}].tool_call_id")
        conversation.append(message)
    if not conversation:
        raise bad("messages must include at least one user message", "messages")
    return conversation, "\n\n".join(s for s in system if s) or None


def _check_tool_calls(calls: list[Any], param: str) -> None:
    """An assistant's tool calls as the model takes them back: refused here rather than by the
    model, which would make the client's bad history look like an upstream failure."""
    for j, call in enumerate(calls):
        p = f"{param}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(call, dict) and isinstance(call.get("id"), str) and call.get("type") == "function"
                and isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]
                and isinstance(function.get("arguments"), str)):
            raise bad("a tool call is {'id': str, 'type': 'function', 'function': {'name': str, 'arguments': str}}", p)


# --------------------------------------------------------------------------- Responses input


def responses_parts(content: Any, role: str, param: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad("content must be a string or an array of parts", param)
    out: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        p = f"{param}[{j}]"
        kind = _part_type(part, p)
        if kind in ("input_text", "output_text", "text", "refusal"):
            key = "refusal" if kind == "refusal" else "text"
            text = part.get(key)
            if not isinstance(text, str):
                raise bad(f"a {kind} part needs a string '{key}'", f"{p}.{key}")
            out.append({"type": "text", "text": text})
        elif kind == "input_image":
            url = check_image_url(part.get("image_url"), f"{p}.image_url")
            image = {"url": url, **({"detail": part["detail"]} if isinstance(part.get("detail"), str) else {})}
            out.append({"type": "image_url", "image_url": image})
        else:
            raise unsupported(f"content parts of type '{kind}' are not supported: send text or images", f"{p}.type")
    if role == "assistant":  # assistant history is plain text for the model
        return "".join(p["text"] for p in out if p["type"] == "text")
    return out


def responses_input(value: str | list[Any], require_message: bool = True) -> tuple[list[dict[str, Any]], str | None]:
    """(chat messages, system text found in the input) from a Responses `input` (or, with
    `require_message` false, a history that may hold no message)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}], None
    messages: list[dict[str, Any]] = []
    system: list[str] = []
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad("input items must be objects", param)
        kind = item.get("type", "message" if "role" in item else None)
        if kind in FILE_TYPES or "file_id" in item:
            raise unsupported("file inputs are not supported: send text or images", f"{param}.type")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad("a message item's role must be user, assistant, system or developer", f"{param}.role")
            content = responses_parts(item.get("content"), role, f"{param}.content")
            if role in ("system", "developer"):
                system.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content))
            else:
                messages.append({"role": role, "content": content})
        elif kind == "function_call":
            call = _function_call(item, param)
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and last.get("tool_calls") and not last.get("content"):
                last["tool_calls"].append(call)  # consecutive calls were one assistant turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str) or output is None:
                raise bad("a function_call_output item needs 'call_id' and 'output'", param)
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": output if isinstance(output, str) else json.dumps(output)})
        elif kind == "reasoning":
            continue  # reasoning summaries of earlier turns are not sent back to the model
        else:
            raise bad(f"input items of type '{kind}' are not supported", f"{param}.type")
    if not messages and require_message:
        raise bad("input must include at least one message", "input")
    return messages, "\n\n".join(s for s in system if s) or None


def _function_call(item: dict[str, Any], param: str) -> dict[str, Any]:
    name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments", "")
    if not isinstance(name, str) or not isinstance(call_id, str):
        raise bad("a function_call item needs string 'name' and 'call_id'", param)
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
