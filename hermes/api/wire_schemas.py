"""JSON Schemas of what the request bodies may hold, for the OpenAPI document.

The rules themselves are enforced in content.py (which answers with the specific error codes,
such as `unsupported_content_type` for files); these schemas say the same thing to clients
and generators, so that a body the schema calls valid is accepted and one it calls invalid is
refused. Keep the two in step: tests/test_api_schema.py runs schemathesis over both.
"""
from __future__ import annotations

from typing import Any

NO_FILE = {"not": {"required": ["file_id"]}}

#: what check_image_url takes: http(s):// and data:image/ URLs, any letter case
IMAGE_URL = {"type": "string", "pattern": "^([hH][tT][tT][pP][sS]?://|[dD][aA][tT][aA]:[iI][mM][aA][gG][eE]/)"}


def _part(kind: Any, required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["type", *required],
            "properties": {"type": kind, **properties}, **NO_FILE}


#: Chat Completions content parts (content.chat_parts)
CHAT_PART = {"oneOf": [
    _part({"const": "text"}, ["text"], {"text": {"type": "string"}}),
    _part({"const": "image_url"}, ["image_url"], {"image_url": {"anyOf": [
        IMAGE_URL,
        {"type": "object", "required": ["url"], "properties": {"url": IMAGE_URL}, **NO_FILE}]}}),
]}
CHAT_CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": CHAT_PART}]}

TOOL_CALL = {"type": "object", "required": ["id", "type", "function"], "properties": {
    "id": {"type": "string"}, "type": {"const": "function"},
    "function": {"type": "object", "required": ["name", "arguments"],
                 "properties": {"name": {"type": "string", "minLength": 1}, "arguments": {"type": "string"}}}}}

def _message(roles: list[str], required: list[str], content: dict[str, Any], **fields: Any) -> dict[str, Any]:
    # tool_calls belong to assistant messages, tool_call_id to tool messages: null elsewhere
    return {"type": "object", "required": ["role", *required], "properties": {
        "role": {"enum": roles}, "content": content, "name": {"type": ["string", "null"]},
        "tool_calls": {"type": "null"}, "tool_call_id": {"type": "null"}, **fields}}


_OR_NULL = {"anyOf": [CHAT_CONTENT, {"type": "null"}]}
#: Chat Completions messages, by role (content.chat_messages)
CHAT_MESSAGE = {"oneOf": [
    _message(["system", "developer"], [], _OR_NULL),
    _message(["user"], ["content"], CHAT_CONTENT),
    _message(["assistant"], [], _OR_NULL,
             tool_calls={"anyOf": [{"type": "array", "items": TOOL_CALL}, {"type": "null"}]}),
    _message(["tool"], ["content", "tool_call_id"], CHAT_CONTENT, tool_call_id={"type": "string"}),
]}
#: a conversation needs one message that is not a system message
CHAT_MESSAGES = {"type": "array", "minItems": 1, "items": CHAT_MESSAGE,
                 "contains": {"type": "object", "required": ["role"],
                              "properties": {"role": {"enum": ["user", "assistant", "tool"]}}}}

#: Responses content parts (content.responses_parts)
RESPONSES_PART = {"oneOf": [
    _part({"enum": ["input_text", "output_text", "text"]}, ["text"], {"text": {"type": "string"}}),
    _part({"const": "refusal"}, ["refusal"], {"refusal": {"type": "string"}}),
    _part({"const": "input_image"}, ["image_url"], {"image_url": IMAGE_URL}),
]}
RESPONSES_CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": RESPONSES_PART}]}

#: Responses input items (content.responses_input)
RESPONSES_ITEM = {"oneOf": [
    {"type": "object", "required": ["role", "content"], **NO_FILE, "properties": {
        "type": {"const": "message"}, "role": {"enum": ["user", "assistant", "system", "developer"]},
        "content": RESPONSES_CONTENT}},
    {"type": "object", "required": ["type", "name", "call_id"], **NO_FILE, "properties": {
        "type": {"const": "function_call"}, "name": {"type": "string"}, "call_id": {"type": "string"}}},
    {"type": "object", "required": ["type", "call_id", "output"], **NO_FILE, "properties": {
        "type": {"const": "function_call_output"}, "call_id": {"type": "string"}, "output": {"not": {"type": "null"}}}},
    {"type": "object", "required": ["type"], **NO_FILE, "properties": {"type": {"const": "reasoning"}}},
]}
#: what makes a message of the conversation: a user or assistant message, a call or its output
_CONVERSATIONAL = {"anyOf": [
    {"type": "object", "required": ["role"],
     "properties": {"role": {"enum": ["user", "assistant"]}, "type": {"const": "message"}}},
    {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["function_call", "function_call_output"]}}},
]}
RESPONSES_ITEMS = {"type": "array", "items": RESPONSES_ITEM}
RESPONSES_INPUT = {"anyOf": [{"type": "string"}, {**RESPONSES_ITEMS, "contains": _CONVERSATIONAL}]}


def not_both(a: str, b: str) -> dict[str, Any]:
    """A body must not carry both fields with a value (null counts as absent)."""
    return {"not": {"type": "object", "required": [a, b],
                    "properties": {a: {"not": {"type": "null"}}, b: {"not": {"type": "null"}}}}}
