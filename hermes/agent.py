"""The agent loop: model -> tool calls -> sandbox -> results -> model, up to max_turns.

The conversation it returns starts at the user message: the system prompt and few-shot
prefill steer the model but are never saved (the trajectory's system turn is generated).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from hermes.model import ModelClient, ModelError
from hermes.sandbox.base import Sandbox
from hermes.tools import run_tool

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are a capable assistant with tools. Commands and file operations run in a private "
    "Linux sandbox for this task; its working directory is yours to use. Think step by step, "
    "call tools when they help, and finish with a clear answer."
)


@dataclass
class AgentRun:
    messages: list[dict[str, Any]]
    completed: bool = False          # ended with an answer of the model's own
    partial: bool = False            # stopped at max_turns while still calling tools
    api_calls: int = 0
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0})
    error: str | None = None


def run_agent(
    client: ModelClient,
    prompt: str,
    tools: list[dict[str, Any]],
    sandbox: Sandbox,
    *,
    max_turns: int,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    prefill: list[dict[str, Any]] | None = None,
    on_tool: Callable[[str, str], None] | None = None,
) -> AgentRun:
    head: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    head += list(prefill or [])
    run = AgentRun(messages=[{"role": "user", "content": prompt}])
    for _ in range(max_turns):
        try:
            reply = client.complete(head + run.messages, tools)
        except ModelError as e:
            run.error = str(e)
            return run
        run.api_calls += 1
        for k, v in reply.usage.items():
            run.usage[k] = run.usage.get(k, 0) + (v or 0)
        message = reply.message
        run.messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            run.completed = True
            return run
        for call in calls:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            if on_tool:
                on_tool(name, arguments)
            result = run_tool(name, arguments, sandbox)
            run.messages.append({"role": "tool", "tool_call_id": call["id"], "name": name, "content": result})
    run.partial = True
    return run


def compose_system_prompt(ephemeral: str | None) -> str:
    """The agent's own prompt with the user's ephemeral one layered on top."""
    return DEFAULT_SYSTEM_PROMPT + ("\n\n" + ephemeral if ephemeral else "")
