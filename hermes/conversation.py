"""One agent conversation in a sandbox: what a batch prompt, `chat` and an API request each are.

The sandbox is lazy (made on the first tool call, or with prefetch while the model thinks) and
gone when the conversation returns, whatever happened; the caller only says what differs:

    batch prompt   image_first, prefetch (the run's setting), remove_in_background
    chat           nothing: a container on first use, removed before the command exits
    API request    events (streamed to the client), cancel (the client left)
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hermes.agent import AgentEvents, AgentRun, run_agent
from hermes.model import ModelClient
from hermes.sandbox import SandboxBackend, SandboxSpec
from hermes.sandbox.lazy import LazySandbox
from hermes.netpolicy import NetPolicy
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

    Raises what the agent loop or image_first raises; the sandbox is closed first, and the
    exception carries `sandbox_wait` as the result would have.
    """
    sandboxed = needs_sandbox(tools)
    if image_first and sandboxed:
        backend.ensure_image(spec.image)
    box = LazySandbox(lambda: backend.open(spec), backend.settings.command_timeout,
                      prefetch=prefetch and sandboxed, remove_in_background=remove_in_background)
    if on_sandbox is not None:
        on_sandbox(box)
    ctx = context or ToolContext()
    ctx.sandbox = box
    ctx.offered = frozenset(t.name for t in tools)
    try:
        with box:
            try:
                run = run_agent(client, prompt, openai_schemas(tools), ctx, max_turns=max_turns,
                                system_prompt=system_prompt, prefill=prefill, events=events, cancel=cancel)
            finally:
                ctx.close()
    except Exception as e:
        e.sandbox_wait = box.wait  # type: ignore[attr-defined]  # a failed prompt still records its wait
        raise
    return Conversation(run=run, sandbox_wait=box.wait, tools=ctx)
