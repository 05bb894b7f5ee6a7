"""The agent behind the API: each request is one agent run, on a worker thread, whose tool
calls run in a sandbox of its own (a Docker container made on the first tool call and removed
when the run ends).

At most `max_concurrent_runs` runs are in flight; one more is refused at once with 429 and
Retry-After rather than queued, so a client learns immediately that the server is busy. A run
counts until its thread has really returned (sandbox removed), whatever became of the client.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from hermes.agent.loop import AgentEvents, AgentRun, compose_system_prompt
from hermes.api.errors import ApiError
from hermes.api.server_settings import ApiSettings
from hermes.agent.conversation import converse, tool_context
from hermes.model.client import ModelClient
from hermes.sandbox import SandboxError, SandboxSpec, get_backend
from hermes.sandbox.base import LABEL_PROMPT, LABEL_RUN
from hermes.sandbox.lazy import LazySandbox
from hermes.settings import AgentSettings
from hermes.tools import SharedResources, env_secret, openai_schemas, tools_for, usable_toolsets

log = logging.getLogger(__name__)

#: label marking the containers of API requests (the run label names the serving process)
API_LABEL = "hermes-batch.api"

#: an agent event, as the loop reports it:
#:   {"type": "content.delta" | "reasoning.delta", "delta": str}
#:   {"type": "message", "message": assistant message}
#:   {"type": "tool.started", "call": tool call}
#:   {"type": "tool.completed", "call": tool call, "result": str}
Event = dict[str, Any]


@dataclass
class AgentRequest:
    messages: list[dict[str, Any]]      # the conversation in chat format, without system messages
    instructions: str | None = None     # the client's system prompt, layered on the agent's own
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


class Halt:
    """What stopping a run ends: the flag the agent checks at its safe points, and the command
    running in its sandbox right now. Closing the sandbox kills that command (the container is
    removed, a local sandbox's process groups are killed), so a stop never waits out a long
    command; the run's thread waits for that close before it returns."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._box: LazySandbox | None = None
        self._closer: threading.Thread | None = None

    def attach(self, box: LazySandbox) -> None:
        with self._lock:
            self._box = box

    def set(self) -> None:
        with self._lock:
            if self.event.is_set():
                return
            self.event.set()
            if self._box is not None:  # on a thread of its own: removing a container blocks
                self._closer = threading.Thread(target=self._box.close, name="hermes-api-stop", daemon=True)
                self._closer.start()

    def join(self) -> None:
        with self._lock:
            closer = self._closer
        if closer is not None:
            closer.join()


@dataclass(eq=False)
class Work:
    """One agent run in flight. `future` resolves to the AgentRun once the thread returned."""

    request: AgentRequest
    halt: Halt
    future: asyncio.Future

    @property
    def cancel(self) -> threading.Event:
        return self.halt.event

    def stop(self) -> None:
        self.halt.set()


class ClientLeft(ApiError):
    """The client hung up before its answer was ready (nginx's 499; nobody reads this answer)."""

    def __init__(self) -> None:
        super().__init__(499, "the client closed the request before it was answered", "client_closed_request")


async def hung_up(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """Returns once the client has gone: called after the body was read, the next ASGI message
    of a request is its http.disconnect."""
    while (await receive())["type"] != "http.disconnect":
        pass


class AgentService:
    def __init__(self, settings: ApiSettings):
        self.settings = settings
        self.sandbox = settings.sandbox_settings()
        self.backend = get_backend(self.sandbox)
        agent = AgentSettings(model=settings.upstream_model, base_url=settings.upstream_base_url,
                              max_turns=settings.max_turns, max_retries=settings.upstream_max_retries,
                              sandbox=self.sandbox)
        self.client = ModelClient(agent)
        self.offered = tools_for(usable_toolsets(agent.tools, env_secret, settings.toolsets))
        self.tools = openai_schemas(self.offered)
        #: what the tools of every request share (HTTP clients, a browser), closed with the server
        self.shared = SharedResources()
        self.agent_settings = agent
        self.label = f"api-{socket.gethostname()}-{os.getpid()}"
        self.executor = ThreadPoolExecutor(max_workers=settings.max_concurrent_runs, thread_name_prefix="hermes-api-agent")
        self.active: set[Work] = set()

    # -- running ---------------------------------------------------------------

    def start(self, request: AgentRequest, on_event: Callable[[Event], None] | None = None, *,
              stream_model: bool = False) -> Work:
        """Start a run now or raise 429. Must be called on the event loop; `on_event` is then
        called on the loop too, in order. `stream_model` relays the model's text as it comes."""
        if len(self.active) >= self.settings.max_concurrent_runs:
            raise ApiError(429, f"the server is running its maximum of {self.settings.max_concurrent_runs} agent "
                           "runs; retry later", "too_many_runs", headers={"Retry-After": str(self.settings.retry_after)})
        loop = asyncio.get_running_loop()
        emit = (lambda ev: loop.call_soon_threadsafe(on_event, ev)) if on_event else None
        halt = Halt()
        future = loop.run_in_executor(self.executor, self._run, request, emit, stream_model, halt)
        work = Work(request, halt, future)
        self.active.add(work)
        future.add_done_callback(lambda _: self.active.discard(work))
        return work

    def _run(self, request: AgentRequest, emit: Callable[[Event], None] | None, stream_model: bool,
             halt: Halt) -> AgentRun:
        events = _events(emit, stream_model) if emit else None
        spec = SandboxSpec(image=self.sandbox.image,
                           labels={LABEL_RUN: self.label, LABEL_PROMPT: request.id, API_LABEL: "1"})
        context = tool_context(self.agent_settings, api_key=self.client.api_key, shared=self.shared,
                               key=request.id)
        try:
            return converse(self.client, request.messages, self.offered, spec, self.backend, context=context,
                            max_turns=self.settings.max_turns, system_prompt=compose_system_prompt(request.instructions),
                            events=events, cancel=halt.event, on_sandbox=halt.attach).run
        finally:
            halt.join()  # a stop's close of the sandbox: the run ends once its sandbox is gone

    def run_blocking(self, request: AgentRequest) -> AgentRun:
        """One run on the caller's own thread, outside the cap (a scheduled job's flow run)."""
        return self._run(request, None, False, Halt())

    async def wait(self, work: Work, client_left: Awaitable[None] | None = None) -> AgentRun:
        """The run's result. If the client leaves (`client_left` returns, or the caller is
        cancelled) the run is asked to stop and ClientLeft is raised; the run keeps its place
        under the cap until its thread has really returned."""
        left = asyncio.ensure_future(client_left) if client_left is not None else None
        try:
            done, _ = await asyncio.wait([work.future] + ([left] if left else []), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.stop()
            raise
        finally:
            if left is not None:
                left.cancel()
        if work.future in done:
            return work.future.result()
        work.stop()
        raise ClientLeft()

    # -- life ------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        return {"active": len(self.active), "stopping": sum(w.cancel.is_set() for w in self.active),
                "limit": self.settings.max_concurrent_runs}

    async def aclose(self) -> None:
        for work in list(self.active):
            work.stop()
        await asyncio.gather(*(w.future for w in list(self.active)), return_exceptions=True)
        self.close()

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        self.shared.close()
        self.client.close()

    def reap_orphans(self) -> int:
        """Remove the sandboxes that API servers which died on this host left behind."""
        try:
            removed = self.backend.cleanup(label=API_LABEL)
        except SandboxError as e:  # no engine yet: nothing to reap, requests will say why
            log.debug("no orphan check: %s", e)
            return 0
        if removed:
            log.info("removed %d container(s) left by API servers that died", removed)
        return removed


def _events(emit: Callable[[Event], None], stream_model: bool) -> AgentEvents:
    return AgentEvents(
        on_delta=(lambda kind, text: emit({"type": f"{kind}.delta", "delta": text})) if stream_model else None,
        on_message=lambda message: emit({"type": "message", "message": message}),
        on_tool_start=lambda call: emit({"type": "tool.started", "call": call}),
        on_tool_end=lambda call, result: emit({"type": "tool.completed", "call": call, "result": result}),
    )


def final_text(messages: list[dict[str, Any]]) -> str:
    """What the agent said, for clients that only show text: its assistant texts, in order."""
    texts = [_text(m.get("content")) for m in messages if m.get("role") == "assistant"]
    return "\n\n".join(t for t in texts if t)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def usage_of(run: AgentRun | None) -> dict[str, int]:
    u = run.usage if run else {}
    return {"prompt_tokens": u.get("prompt_tokens", 0), "completion_tokens": u.get("completion_tokens", 0),
            "total_tokens": u.get("total_tokens", 0)}
