"""The agent loop: model -> tool calls -> sandbox -> results -> model, up to max_turns.

The conversation it returns starts at the user message: the system prompt and few-shot
prefill steer the model but are never saved (the trajectory's system turn is generated).

For servers (hermes/api) the loop also takes a whole conversation instead of one prompt,
reports what it does through optional callbacks (AgentEvents; with `on_delta` the model is
streamed), and stops at the next safe point once a `cancel` event is set: before a model call
or a tool call, never in the middle of one.
"""
from __future__ import annotations

import contextvars
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from hermes.model.client import ModelClient, ModelError, Reply
from hermes.model.context import CONTEXT_LENGTH, fit_results
from hermes.sandbox.base import Sandbox
from hermes.tools import ToolContext, get_tool, run_tool
from hermes.tools._common import error as tool_error

log = logging.getLogger(__name__)

#: most tool calls of one assistant turn running at once (models ask for several in parallel)
MAX_PARALLEL_TOOLS = 4

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
    #: the exception behind `error`, which says its kind and whether it passes (hermes.errors)
    failure: ModelError | None = field(default=None, repr=False, compare=False)
    cancelled: bool = False          # stopped because `cancel` was set
    #: why a partial run stopped before its answer, where not max_turns: "context_length"
    stop_reason: str | None = None


@dataclass
class AgentEvents:
    """What a caller may watch while the loop runs; each callback is optional and is called
    on the loop's own thread, so it must be quick (hand the event over, do not work)."""

    on_delta: Callable[[str, str], None] | None = None      # ("content"|"reasoning", text): streams the model
    on_message: Callable[[dict[str, Any]], None] | None = None  # each assistant message, once complete
    on_tool_start: Callable[[dict[str, Any]], None] | None = None  # a tool call, about to run
    on_tool_end: Callable[[dict[str, Any], str], None] | None = None  # that call and its result


#: the result a tool call gets when the run is stopped before it ran: the conversation stays
#: well-formed (every tool call answered), so it can be stored and continued
CANCELLED_RESULT = tool_error("not run: the run was stopped before this tool call")


class _Turns:
    """One conversation between model calls: what the loop's two drivers (run_agent on a thread,
    run_agent_async as a coroutine) do alike with each reply and each turn's tool results."""

    def __init__(self, prompt: str | list[dict[str, Any]], system_prompt: str | None,
                 prefill: list[dict[str, Any]] | None, events: AgentEvents | None):
        self.head: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.head += list(prefill or [])
        start = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        self.run = AgentRun(messages=start)
        self.events = events or AgentEvents()
        self.context: tuple[int | None, int | None] = (None, None)  # the model's context, max_tokens

    def asked(self) -> list[dict[str, Any]]:
        """What the next model call sends."""
        return self.head + self.run.messages

    def answered(self, reply: Reply) -> list[dict[str, Any]]:
        """Take a reply in; its tool calls (none: the run is complete)."""
        run = self.run
        run.api_calls += 1
        for k, v in reply.usage.items():
            run.usage[k] = run.usage.get(k, 0) + (v or 0)
        run.messages.append(reply.message)
        if self.events.on_message:
            self.events.on_message(reply.message)
        calls = reply.message.get("tool_calls") or []
        run.completed = not calls
        return calls

    def ran(self, calls: list[dict[str, Any]], results: list[str]) -> bool:
        """Take a turn's results in; True when the run was stopped meanwhile."""
        run = self.run
        run.cancelled = run.cancelled or any(r is CANCELLED_RESULT for r in results)
        results = fit_results(results, self.asked(), *self.context)  # cut to fit the model's context
        for call, result in zip(calls, results):
            run.messages.append({"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                                 "content": result})
        return run.cancelled


def run_agent(
    client: ModelClient,
    prompt: str | list[dict[str, Any]],
    tools: list[dict[str, Any]],
    tool_ctx: ToolContext | Sandbox,
    *,
    max_turns: int,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    prefill: list[dict[str, Any]] | None = None,
    on_tool: Callable[[str, str], None] | None = None,
    events: AgentEvents | None = None,
    cancel: threading.Event | None = None,
    max_parallel_tools: int = MAX_PARALLEL_TOOLS,
) -> AgentRun:
    """Run the loop on `prompt`, a user message or a whole conversation (chat messages without
    the system prompt). The returned messages are that conversation plus what the run added.

    `tool_ctx` is what tool calls run with: the prompt's ToolContext (or just its sandbox)."""
    turns = _Turns(prompt, system_prompt, prefill, events)
    turns.context = (getattr(client, "context_length", None), getattr(client, "max_tokens", None))
    run, ev = turns.run, turns.events
    stopped = cancel.is_set if cancel is not None else (lambda: False)
    for _ in range(max_turns):
        if stopped():
            run.cancelled = True
            return run
        try:
            if ev.on_delta:
                reply = client.complete_stream(turns.asked(), tools, ev.on_delta)
            else:
                reply = client.complete(turns.asked(), tools)
        except ModelError as e:
            _model_failed(run, e)
            return run
        calls = turns.answered(reply)
        if not calls or turns.ran(calls, _run_calls(calls, tool_ctx, stopped, on_tool, ev, max_parallel_tools)):
            return run
    run.partial = True
    return run


def _model_failed(run: AgentRun, e: ModelError) -> None:
    if e.kind == CONTEXT_LENGTH:
        # The conversation outgrew the model: asking again fails again, so the run ends here as a
        # partial with its trajectory, not as a failure a resume retries forever (hermes.model.context).
        run.partial, run.stop_reason = True, CONTEXT_LENGTH
        log.info("the conversation exceeds the model's context: ended as partial (%s)", e)
    else:
        run.error, run.failure = str(e), e


#: runs a blocking call off the event loop and awaits its result (hermes.agent.offload.Offload)
Offloader = Callable[..., Awaitable[Any]]


async def run_agent_async(
    client: ModelClient,
    prompt: str | list[dict[str, Any]],
    tools: list[dict[str, Any]],
    tool_ctx: ToolContext | Sandbox,
    *,
    offload: Offloader,
    max_turns: int,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    prefill: list[dict[str, Any]] | None = None,
    cancel: threading.Event | None = None,
    max_parallel_tools: int = MAX_PARALLEL_TOOLS,
) -> AgentRun:
    """run_agent as a coroutine on the model client's event loop (a batch run's prompts): each
    model call is awaited there, each turn's tool calls run through `offload` on a thread. No
    events and no streaming: those are the API server's, whose requests keep run_agent."""
    turns = _Turns(prompt, system_prompt, prefill, None)
    turns.context = (getattr(client, "context_length", None), getattr(client, "max_tokens", None))
    run, ev = turns.run, turns.events
    stopped = cancel.is_set if cancel is not None else (lambda: False)
    for _ in range(max_turns):
        if stopped():
            run.cancelled = True
            return run
        try:
            reply = await client.complete_async(turns.asked(), tools)
        except ModelError as e:
            _model_failed(run, e)
            return run
        calls = turns.answered(reply)
        if not calls or turns.ran(calls, await offload(_run_calls, calls, tool_ctx, stopped, None, ev,
                                                       max_parallel_tools)):
            return run
    run.partial = True
    return run


def _run_calls(calls: list[dict[str, Any]], tool_ctx: Any, stopped: Callable[[], bool],
               on_tool: Callable[[str, str], None] | None, ev: AgentEvents, max_parallel: int) -> list[str]:
    """Run one turn's tool calls; results in call order. Calls run concurrently (at most
    `max_parallel` lanes at once) in groups split at each tool that must run alone; within a
    group the calls that run in the sandbox form one lane, in call order."""
    results: list[str | None] = [None] * len(calls)

    def one(i: int) -> None:
        call = calls[i]
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        if stopped():
            results[i] = CANCELLED_RESULT
            return
        if on_tool:
            on_tool(name, arguments)
        if ev.on_tool_start:
            ev.on_tool_start(call)
        results[i] = run_tool(name, arguments, tool_ctx, call_id=str(call.get("id") or ""))
        if ev.on_tool_end:
            ev.on_tool_end(call, results[i])

    def in_turn(indices: list[int]) -> None:
        for i in indices:
            one(i)

    for group in _groups(calls):
        # Calls in the sandbox take turns on its one command channel (side by side, each would cost
        # the engine an exec of its own: slower at the engine's ceiling, measured); the others
        # (web, vision, image, browser: in this process) run beside them and each other.
        boxed = [i for i in group if _needs_sandbox(calls[i])]
        lanes = ([boxed] if boxed else []) + [[i] for i in group if i not in boxed]
        if len(lanes) == 1 or max_parallel <= 1:
            in_turn(group)
            continue
        # Each lane runs in a copy of this thread's context, so logs still reach the prompt's run.
        with ThreadPoolExecutor(max_workers=min(max_parallel, len(lanes)), thread_name_prefix="tool") as pool:
            for f in [pool.submit(contextvars.copy_context().run, in_turn, lane) for lane in lanes]:
                f.result()
    return [r if r is not None else CANCELLED_RESULT for r in results]


def _needs_sandbox(call: dict[str, Any]) -> bool:
    tool = get_tool(call["function"]["name"])
    return tool is None or bool(tool.needs_sandbox)  # unknown ones answer at once either way


def _groups(calls: list[dict[str, Any]]) -> list[list[int]]:
    """Indices of calls that may run together: a tool marked exclusive forms a group of its own."""
    groups: list[list[int]] = [[]]
    for i, call in enumerate(calls):
        tool = get_tool(call["function"]["name"])
        if tool is not None and tool.exclusive:
            groups += [[i], []]
        else:
            groups[-1].append(i)
    return [g for g in groups if g]


def compose_system_prompt(ephemeral: str | None) -> str:
    """The agent's own prompt with the user's ephemeral one layered on top."""
    return DEFAULT_SYSTEM_PROMPT + ("\n\n" + ephemeral if ephemeral else "")
