"""One agent conversation in a sandbox: what a batch prompt, `chat` and an API request each are.

The sandbox is lazy (made on the first tool call, or with prefetch while the model thinks) and
gone when the conversation returns, whatever happened; the caller only says what differs:

    batch prompt   converse_async (a coroutine), image_first, prefetch (the run's setting),
                   remove_in_background, the row's prepare/judge (hermes.data.task), timeout
                   (--prompt_timeout)
    chat           nothing: a container on first use, removed before the command exits
    API request    events (streamed to the client), cancel (the client left)
"""
from __future__ import annotations

import asyncio
import contextvars
import threading
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hermes.agent.loop import AgentEvents, AgentRun, run_agent, run_agent_async
from hermes.data.entry import Reward
from hermes.model.client import ModelClient
from hermes.sandbox import Sandbox, SandboxBackend, SandboxError, SandboxSpec
from hermes.sandbox.lazy import LazySandbox
from hermes.netpolicy import NetPolicy
from hermes.agent.offload import Offload
from hermes.settings import AgentSettings
from hermes.tools import ModelEndpoint, SharedResources, Tool, ToolContext, env_secret, needs_sandbox, openai_schemas


def tool_context(settings: AgentSettings, *, api_key: str | None, shared: SharedResources,
                 secret: Callable[[str], str | None] = env_secret, run_dir: Path | None = None,
                 key: str = "") -> ToolContext:
    """What a conversation's tool calls get from its settings: the toolsets' own settings, the
    agent's endpoint (auxiliary models default to it), the URL rules, shared clients."""
    return ToolContext(settings=settings.tools, secret=secret, shared=shared, run_dir=run_dir, key=key,
                       endpoint=ModelEndpoint(settings.base_url, settings.model, api_key),
                       net=NetPolicy.from_hosts(settings.web_allow_hosts))


@dataclass
class Conversation:
    run: AgentRun
    #: seconds the first tool call waited for the sandbox to be ready (None: no tool call)
    sandbox_wait: float | None
    #: what the tool calls ran with: aux_usage and files of the conversation are in it
    tools: ToolContext
    #: the row's check, judged in the sandbox once the agent finished (None: no check, or not reached)
    reward: Reward | None = None


class PromptTimeout(SandboxError):
    """The conversation passed its wall-clock limit: it was cancelled and its sandbox removed."""

    kind = "prompt deadline"
    transient = False


def converse(
    client: ModelClient,
    prompt: str | list[dict[str, Any]],
    tools: list[Tool],
    spec: SandboxSpec,
    backend: SandboxBackend,
    *,
    context: ToolContext | None = None,
    max_turns: int,
    system_prompt: str | None,
    prefill: list[dict[str, Any]] | None = None,
    events: AgentEvents | None = None,
    cancel: threading.Event | None = None,
    prefetch: bool = False,
    remove_in_background: bool = False,
    image_first: bool = False,
    on_sandbox: Callable[[LazySandbox], None] | None = None,
    prepare: Callable[[Sandbox], None] | None = None,
    judge: Callable[[Sandbox], Reward] | None = None,
    timeout: float | None = None,
) -> Conversation:
    """Run the agent on `prompt` (a user message, or a conversation without system messages)
    offering `tools` (registered Tools); the calls of tools that need the sandbox run in one
    `backend` opens from `spec`. `context` carries what else the tools get (settings, secrets,
    run folder, shared clients); its sandbox is set here, and it is closed (per-prompt tool
    state such as a browser context) when the conversation ends, however it ends.

    image_first: make sure the image is here before the model is asked, so a prompt whose image
    is missing fails (ImageUnavailable) without spending a model call. prefetch: start the
    sandbox as the conversation starts. Neither happens when no offered tool needs the sandbox:
    such a conversation costs no container. remove_in_background: the sandbox's removal is left
    to the backend's removers (the run's end waits for them). on_sandbox: called with the
    (lazy) sandbox before the agent starts, e.g. so that a stop can close it mid-command.

    prepare: run in the sandbox before the agent starts (a row's files and setup; what it raises
    fails the conversation before any model call). judge: run in the same sandbox once the agent
    finished without error, before the sandbox goes; its Reward is the result's. Either makes
    the conversation have a sandbox whatever its tools.

    timeout: seconds the whole conversation (prepare, model calls, tools, judge) may take; past
    them it is cancelled, its sandbox removed at once (a tool call blocked in it fails), and
    PromptTimeout raised: the caller's thread is free on time, whatever a tool call does.

    Raises what the agent loop or image_first raises; the sandbox is closed first, and the
    exception carries `sandbox_wait` as the result would have.
    """
    if image_first and _sandboxed(tools, prepare, judge):
        backend.ensure_image(spec.image)
    box, ctx = _sandbox_and_context(tools, spec, backend, context, prefetch, remove_in_background, prepare, judge)
    if on_sandbox is not None:
        on_sandbox(box)
    cancel = cancel or threading.Event()

    def talk() -> Conversation:
        reward = None
        try:
            with box:
                try:
                    if prepare is not None:
                        prepare(box)
                    run = run_agent(client, prompt, openai_schemas(tools), ctx, max_turns=max_turns,
                                    system_prompt=system_prompt, prefill=prefill, events=events, cancel=cancel)
                    if judge is not None and not run.error and not cancel.is_set():
                        reward = judge(box)
                finally:
                    ctx.close()
        except Exception as e:
            e.sandbox_wait = box.wait  # type: ignore[attr-defined]  # a failed prompt still records its wait
            raise
        return Conversation(run=run, sandbox_wait=box.wait, tools=ctx, reward=reward)

    if timeout is None:
        return talk()
    return _within(talk, timeout, cancel, box)


async def converse_async(
    client: ModelClient,
    prompt: str | list[dict[str, Any]],
    tools: list[Tool],
    spec: SandboxSpec,
    backend: SandboxBackend,
    *,
    offload: Offload,
    context: ToolContext | None = None,
    max_turns: int,
    system_prompt: str | None,
    prefill: list[dict[str, Any]] | None = None,
    prefetch: bool = False,
    remove_in_background: bool = False,
    image_first: bool = False,
    prepare: Callable[[Sandbox], None] | None = None,
    judge: Callable[[Sandbox], Reward] | None = None,
    timeout: float | None = None,
) -> Conversation:
    """converse() as a coroutine on the model client's loop, which is what a batch run's prompts
    are (hermes.run.runner): the model calls are awaited there, and whatever blocks (the image check,
    prepare and judge, tool calls, closing the tool state and the sandbox) runs through `offload`
    on a thread. No events, no cancel from outside: those are the API server's (converse).

    Past `timeout` the conversation is cancelled where it waits (a model call is taken back at
    once), its sandbox removed now (a tool call blocked in it fails), and PromptTimeout raised.
    """
    if image_first and _sandboxed(tools, prepare, judge) and not backend.image_known(spec.image):
        await offload(backend.ensure_image, spec.image)
    box, ctx = _sandbox_and_context(tools, spec, backend, context, prefetch, remove_in_background, prepare, judge,
                                    prefetch_on=offload.pool)
    cancel = threading.Event()

    async def talk() -> Conversation:
        reward = None
        try:
            try:
                if prepare is not None:
                    await offload(prepare, box)
                run = await run_agent_async(client, prompt, openai_schemas(tools), ctx, offload=offload,
                                            max_turns=max_turns, system_prompt=system_prompt, prefill=prefill,
                                            cancel=cancel)
                if judge is not None and not run.error and not cancel.is_set():
                    reward = await offload(judge, box)
            finally:
                await offload(_close, ctx, box)
        except Exception as e:
            e.sandbox_wait = box.wait  # type: ignore[attr-defined]  # a failed prompt still records its wait
            raise
        return Conversation(run=run, sandbox_wait=box.wait, tools=ctx, reward=reward)

    if timeout is None:
        return await talk()
    talking = asyncio.ensure_future(talk())
    await asyncio.wait([talking], timeout=timeout)
    if talking.done():
        return talking.result()
    cancel.set()  # a tool call under way sees it before the next one
    talking.cancel()
    talking.add_done_callback(_retrieved)
    await offload(box.abort)
    raise _timed_out(timeout, box)


def _close(ctx: ToolContext, box: LazySandbox) -> None:
    """The tool state, then the sandbox, however the first close ends (one trip to the pool)."""
    try:
        ctx.close()
    finally:
        box.close()


def _retrieved(task: "asyncio.Future[Any]") -> None:
    if not task.cancelled():
        task.exception()  # a timed-out conversation's own failure while it was being cancelled


def _sandboxed(tools: list[Tool], prepare: Any, judge: Any) -> bool:
    return needs_sandbox(tools) or prepare is not None or judge is not None


def _sandbox_and_context(tools: list[Tool], spec: SandboxSpec, backend: SandboxBackend, context: ToolContext | None,
                         prefetch: bool, remove_in_background: bool, prepare: Any, judge: Any,
                         prefetch_on: Executor | None = None) -> tuple[LazySandbox, ToolContext]:
    """The conversation's lazy sandbox, and the tool context its calls run with. On a pool, even
    a sandbox quick to open is prefetched: costing no thread of its own, its making (a local
    folder's, three directories) is done while the model thinks, not in the first tool call."""
    worth_it = prefetch_on is not None or backend.slow_to_open
    box = LazySandbox(lambda: backend.open(spec), backend.settings.command_timeout,
                      prefetch=prefetch and _sandboxed(tools, prepare, judge) and worth_it,
                      remove_in_background=remove_in_background, prefetch_on=prefetch_on)
    ctx = context or ToolContext()
    ctx.sandbox = box
    ctx.offered = frozenset(t.name for t in tools)
    return box, ctx


def _timed_out(timeout: float, box: LazySandbox) -> PromptTimeout:
    err = PromptTimeout(f"the prompt did not finish within its time limit of {timeout:g}s (--prompt_timeout): "
                        "cancelled, its sandbox removed")
    err.sandbox_wait = box.wait  # type: ignore[attr-defined]
    return err


def _within(talk: Callable[[], Conversation], timeout: float, cancel: threading.Event,
            box: LazySandbox) -> Conversation:
    """talk() in a thread of its own, given up on after `timeout` s: cancelled (the agent stops at
    its next safe point) and its sandbox removed now, so a tool call blocked in it ends too."""
    outcome: list[Any] = []

    def body() -> None:
        try:
            outcome.append(talk())
        except BaseException as e:  # handed to the caller's thread
            outcome.append(e)

    worker = threading.Thread(target=contextvars.copy_context().run, args=(body,), name="conversation", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        cancel.set()
        box.abort()
        raise _timed_out(timeout, box)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]
