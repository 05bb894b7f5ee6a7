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
from typing import Any

from hermes.agent import AgentEvents, AgentRun, run_agent
from hermes.model import ModelClient
from hermes.sandbox import SandboxBackend, SandboxSpec
from hermes.sandbox.lazy import LazySandbox


@dataclass
class Conversation:
    run: AgentRun
    #: seconds the first tool call waited for the sandbox to be ready (None: no tool call)
    sandbox_wait: float | None


def converse(
    client: ModelClient,
    prompt: str | list[dict[str, Any]],
    tools: list[dict[str, Any]],
    spec: SandboxSpec,
    backend: SandboxBackend,
    *,
    max_turns: int,
    system_prompt: str | None,
    prefill: list[dict[str, Any]] | None = None,
    events: AgentEvents | None = None,
    cancel: threading.Event | None = None,
    prefetch: bool = False,
    remove_in_background: bool = False,
    image_first: bool = False,
) -> Conversation:
    """Run the agent on `prompt` (a user message, or a conversation without system messages)
    with `tools` (OpenAI tool schemas), its tool calls in a sandbox `backend` opens from `spec`.

    image_first: make sure the image is here before the model is asked, so a prompt whose image
    is missing fails (ImageUnavailable) without spending a model call. prefetch: start the
    sandbox as the conversation starts, unless no tool could use it. remove_in_background: the
    sandbox's removal is left to the backend's removers (the run's end waits for them).

    Raises what the agent loop or image_first raises; the sandbox is closed first, and the
    exception carries `sandbox_wait` as the result would have.
    """
    if image_first:
        backend.ensure_image(spec.image)
    box = LazySandbox(lambda: backend.open(spec), backend.settings.command_timeout,
                      prefetch=prefetch and bool(tools), remove_in_background=remove_in_background)
    try:
        with box:
            run = run_agent(client, prompt, tools, box, max_turns=max_turns, system_prompt=system_prompt,
                            prefill=prefill, events=events, cancel=cancel)
    except Exception as e:
        e.sandbox_wait = box.wait  # type: ignore[attr-defined]  # a failed prompt still records its wait
        raise
    return Conversation(run=run, sandbox_wait=box.wait)
