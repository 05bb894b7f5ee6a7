"""Runs: an agent run a client starts, then polls or watches, and may stop.

    POST /v1/runs                 -> 202 {"run_id", "status": "started"}
    GET  /v1/runs/{id}            -> status, output, usage
    GET  /v1/runs/{id}/events     -> SSE: run.started, message.delta, tool.started,
                                     tool.completed, run.stopping, then one of run.completed,
                                     run.failed, run.cancelled (each event's `id` is its
                                     sequence number: Last-Event-ID resumes after it)
    POST /v1/runs/{id}/stop       -> {"status": "stopping"}, then `cancelled` once stopped

Events are buffered so a client may attach late (or again). While nobody is attached, events
older than `run_events_ttl` seconds are dropped; that only drops transport state: the run itself stays
pollable, stoppable and counted against the concurrency cap until its worker has returned,
and then for `run_retention` seconds more. A stopped run is `stopping` until the agent has
reached a safe point and its sandbox is gone, and only then `cancelled`.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Annotated, Any, AsyncIterator

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import StreamingResponse
from pydantic import Field, ConfigDict, WithJsonSchema

from hermes.api import sse
from hermes.api.content import TextOnly, responses_input
from hermes.api.errors import ApiError, not_found
from hermes.api.wire_schemas import RESPONSES_INPUT, RESPONSES_ITEMS, not_both
from hermes.api.service import AgentRequest, AgentService, Event, Work, final_text, usage_of

router = APIRouter()

TERMINAL = ("completed", "failed", "cancelled")
#: characters of a tool result carried by a tool.completed event
RESULT_PREVIEW = 2000


class RunRequest(TextOnly):
    model_config = ConfigDict(extra="allow", json_schema_extra=not_both("conversation_history", "previous_response_id"))

    # checked by content.responses_input; the document says the same (wire_schemas)
    input: Annotated[str | list[dict[str, Any]], WithJsonSchema(RESPONSES_INPUT)]
    instructions: str | None = None
    session_id: str | None = None
    conversation_history: Annotated[list[dict[str, Any]] | None,
                                    WithJsonSchema({"anyOf": [RESPONSES_ITEMS, {"type": "null"}]})] = None
    previous_response_id: str | None = Field(None, min_length=1)
    model: str | None = None


class Run:
    def __init__(self, run_id: str, session_id: str | None, model: str):
        self.id, self.session_id, self.model = run_id, session_id, model
        self.status = "started"
        self.output: str | None = None
        self.usage: dict[str, int] | None = None
        self.error: str | None = None
        self.created_at = time.time()
        self.ended_at: float | None = None
        self.work: Work | None = None
        self.events: list[dict[str, Any]] = []
        self.first_seq = 0          # sequence number of events[0] (earlier ones expired)
        self.next_seq = 0
        self.readers = 0
        self.history = 0
        self._wake = asyncio.Event()

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def emit(self, kind: str, **data: Any) -> None:
        self.events.append({"seq": self.next_seq, "event": kind,
                            "data": {"run_id": self.id, "timestamp": time.time(), **data}})
        self.next_seq += 1
        self._wake.set()
        self._wake = asyncio.Event()

    def on_agent_event(self, ev: Event) -> None:
        kind = ev["type"]
        if kind == "content.delta":
            self.emit("message.delta", delta=ev["delta"])
        elif kind == "reasoning.delta":
            self.emit("reasoning.delta", delta=ev["delta"])
        elif kind in ("tool.started", "tool.completed"):
            call = ev["call"]
            data = {"call_id": call["id"], "tool": call["function"]["name"]}
            if kind == "tool.started":
                data["arguments"] = call["function"]["arguments"]
            else:
                data["result"] = ev["result"][:RESULT_PREVIEW]
            self.emit(kind, **data)

    def finished(self, future: asyncio.Future) -> None:
        """The worker has returned: the sandbox is gone, and only now is the run terminal."""
        self.ended_at = time.time()
        try:
            run = future.result()
        except (Exception, asyncio.CancelledError) as e:  # a bug of ours, or shutdown: the server goes on
            self.status, self.error = "failed", f"internal error: {type(e).__name__}"
            self.emit("run.failed", error=self.error)
            return
        self.output = final_text(run.messages[self.history:])
        u = usage_of(run)
        self.usage = {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
                      "total_tokens": u["total_tokens"]}
        if run.cancelled:
            self.status = "cancelled"
        elif run.error and not self.output:
            self.status, self.error = "failed", f"the upstream model failed: {run.error}"
        else:
            self.status = "completed"
        self.emit(f"run.{self.status}", status=self.status, output=self.output, usage=self.usage, error=self.error)

    def view(self) -> dict[str, Any]:
        return {"object": "hermes.run", "run_id": self.id, "status": self.status, "session_id": self.session_id,
                "model": self.model, "output": self.output, "usage": self.usage, "error": self.error,
                "created_at": int(self.created_at), "ended_at": int(self.ended_at) if self.ended_at else None,
                "events_buffered": len(self.events)}

    async def subscribe(self, after: int | None) -> AsyncIterator[bytes]:
        """The run's events as SSE bytes: buffered ones after `after`, then live ones until the
        run is terminal. A client may hang up at any point: its reader count goes back down in
        `finally` (the response task is cancelled on disconnect), so the run is swept as usual."""
        self.readers += 1
        try:
            seq = self.first_seq if after is None else max(after + 1, self.first_seq)
            if after is None and self.first_seq > 0:
                # the buffer expired unread: say where the run stands before going on live
                yield sse.event(self.view(), "run.status")
            while True:
                while seq < self.next_seq:
                    ev = self.events[seq - self.first_seq]
                    seq += 1
                    yield sse.event(ev["data"], ev["event"], str(ev["seq"]))
                    # let the loop see a hang-up between events, rather than write a long buffer
                    # into a dead socket (asyncio logs each such write)
                    await asyncio.sleep(0)
                if self.terminal:
                    return
                try:
                    await asyncio.wait_for(self._wake.wait(), sse.KEEPALIVE_SECONDS)
                except asyncio.TimeoutError:
                    yield sse.KEEPALIVE_COMMENT
        finally:
            self.readers -= 1

    def expire_events(self, ttl: float) -> None:
        """With nobody attached, drop the events that have waited unread for `ttl` seconds."""
        if self.readers:
            return
        horizon = time.time() - ttl
        stale = next((i for i, ev in enumerate(self.events) if ev["data"]["timestamp"] >= horizon), len(self.events))
        if stale:
            self.events = self.events[stale:]
            self.first_seq += stale


class RunRegistry:
    def __init__(self, service: AgentService, events_ttl: float, retention: float):
        self.service, self.events_ttl, self.retention = service, events_ttl, retention
        self.runs: dict[str, Run] = {}

    def get(self, run_id: str) -> Run:
        run = self.runs.get(run_id)
        if run is None:
            raise not_found("run", run_id)
        return run

    def sweep(self) -> None:
        now = time.time()
        for run_id, run in list(self.runs.items()):
            run.expire_events(self.events_ttl)
            if run.terminal and run.ended_at and now - run.ended_at > self.retention and run.readers == 0:
                del self.runs[run_id]

    async def sweeper(self) -> None:
        interval = max(0.2, min(30.0, self.events_ttl / 4))
        while True:
            await asyncio.sleep(interval)
            self.sweep()

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in ("started", "running", "stopping", *TERMINAL)}
        for run in self.runs.values():
            out[run.status] = out.get(run.status, 0) + 1
        return out


def registry(request: Request) -> RunRegistry:
    return request.app.state.runs


def existing_run(run_id: str, runs: RunRegistry = Depends(registry)) -> Run:
    # A dependency, so an unknown id is a 404 before any event stream begins.
    return runs.get(run_id)


@router.post("/v1/runs", status_code=202)
async def create_run(body: RunRequest, request: Request, runs: RunRegistry = Depends(registry)):
    if body.conversation_history is not None and body.previous_response_id is not None:
        raise ApiError(400, "send conversation_history or previous_response_id, not both", "invalid_request",
                       "previous_response_id")
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        stored = request.app.state.store.get(body.previous_response_id)
        if stored is None:
            raise not_found("previous response", body.previous_response_id, "previous_response_id")
        history = stored.messages
    elif body.conversation_history:
        history, _ = responses_input(body.conversation_history, require_message=False)
    new, system = responses_input(body.input)
    instructions = "\n\n".join(s for s in (body.instructions, system) if s) or None
    run = Run(f"run_{uuid.uuid4().hex}", body.session_id, request.app.state.settings.model_name)
    run.history = len(history) + len(new)
    run.work = runs.service.start(AgentRequest(history + new, instructions, run.id[4:16]), run.on_agent_event,
                                  stream_model=True)
    runs.runs[run.id] = run
    run.emit("run.started", status="started", session_id=run.session_id)
    run.status = "running"
    run.work.future.add_done_callback(run.finished)
    return {"object": "hermes.run", "run_id": run.id, "status": "started", "session_id": run.session_id}


@router.get("/v1/runs/{run_id}")
async def get_run(run: Run = Depends(existing_run)):
    return run.view()


@router.get("/v1/runs/{run_id}/events", response_class=StreamingResponse,
            responses={200: {"description": "the run's events", "content": {"text/event-stream": {"schema": {"type": "object"}}}}})
async def run_events(run: Run = Depends(existing_run),
                     last_event_id: str | None = Header(None, alias="Last-Event-ID")):
    # A plain streaming response, not FastAPI's generator endpoint: that one's keep-alive task
    # fails with BrokenResourceError (a logged traceback) when the client hangs up mid-stream.
    after = int(last_event_id) if last_event_id and last_event_id.isdigit() else None
    return sse.stream(run.subscribe(after))


@router.post("/v1/runs/{run_id}/stop")
async def stop_run(run: Run = Depends(existing_run)):
    if not run.terminal and run.status != "stopping":
        run.status = "stopping"
        run.emit("run.stopping", status="stopping")
        assert run.work is not None
        run.work.stop()
    return {"object": "hermes.run", "run_id": run.id, "status": run.status}
