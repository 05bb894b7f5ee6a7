"""Scripted conversations: a ``MOCK_SCRIPT: {json}`` line in the user message decides each turn."""
from __future__ import annotations

import json
from typing import Any

from mockllm import branches
from mockllm.conversation import SCRIPT_MARKER, BadRequest, Conversation, Reply, ToolCall

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
    if isinstance(script, dict) and branches.is_branched(script):  # pass / fail per conversation
        branches.check_branched(script, _check_turn)
        return script
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
    times = turn.get("times")
    if times is not None and not (isinstance(times, int) and times >= 0):
        raise BadRequest(f"MOCK_SCRIPT turns[{i}].times must be a non-negative integer")
    sleep = turn.get("sleep", 0)
    if not isinstance(sleep, (int, float)) or sleep < 0:
        raise BadRequest(f"MOCK_SCRIPT turns[{i}].sleep must be a non-negative number")


def scripted_reply(script: dict, conv: Conversation) -> Reply:
    mark = ""
    if branches.is_branched(script):  # the branch's turns; its mark rides in the call ids
        script, mark = branches.branch_of(script, conv)
    n = conv.assistant_turns
    if n >= len(script["turns"]):
        return Reply(content="Done.")
    turn = script["turns"][n]
    calls = [
        ToolCall(_call_id(conv.token + mark, n, i), c["name"], _encode_arguments(c.get("arguments", {})))
        for i, c in enumerate(turn.get("tool_calls") or [])
    ]
    content = turn.get("content")
    return Reply(
        content=content if content is not None or calls else "",
        reasoning=turn.get("reasoning"),
        tool_calls=calls,
        error_status=turn.get("error"),
        error_times=turn.get("times"),
        sleep=float(turn.get("sleep", 0)),
    )


def _encode_arguments(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _call_id(token: str, n: int, i: int) -> str:
    return f"call_{token}_{n}_{i}"

