"""POST /v1/chat/completions: stateless; the whole conversation comes with each request.

The client's system message is layered on the agent's own system prompt. The answer is the
agent's text (every assistant text of this request, in order); its tool calls and results
stay on the server. With `stream: true` the text is streamed as `chat.completion.chunk`
events, and `event: hermes.tool.progress` events report each tool as it starts and ends.
Their data carries one choice with an empty delta, so the usual client loop
(`chunk.choices[0].delta.content or ""`) passes over them. Clients that cannot take a named
event (openai-node 4.x hands it over as `{event, data}`) turn them off per request with
`stream_options: {"include_tool_progress": false}`, or for the server with
API_SERVER_TOOL_PROGRESS=false.

A client that hangs up, streaming or not, stops its agent at the next safe point.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Annotated, Any, AsyncIterator, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, WithJsonSchema

from hermes.api import sse
from hermes.api.content import TextOnly, chat_messages
from hermes.api.errors import ApiError, error_body
from hermes.api.wire_schemas import CHAT_MESSAGES
from hermes.api.service import AgentRequest, AgentService, Event, final_text, hung_up, usage_of
from hermes.data.stats import is_tool_failure

router = APIRouter()

#: characters of a tool's arguments shown in a progress label
LABEL_CHARS = 120


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class StreamOptions(BaseModel):
    include_usage: StrictBool = False
    include_tool_progress: StrictBool | None = Field(
        None, description="hermes.tool.progress events in the stream (default: the server's tool_progress setting)")


class ChatRequest(TextOnly):
    # Sampling parameters, client tools and the like are accepted and left to the agent:
    # the server decides how its own model is called (the `model` field is display only).
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    # validated here and in content.chat_messages; the document says the same (wire_schemas)
    messages: Annotated[list[ChatMessage], WithJsonSchema(CHAT_MESSAGES)] = Field(min_length=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatRequest, request: Request):
    conversation, system = chat_messages([m.model_dump(exclude_none=True) for m in body.messages])
    service: AgentService = request.app.state.service
    agent_request = AgentRequest(conversation, system)
    completion = Completion(request.app.state.settings.model_name)
    if body.stream:
        options = body.stream_options or StreamOptions()
        progress = options.include_tool_progress
        if progress is None:
            progress = request.app.state.settings.tool_progress
        queue: asyncio.Queue = asyncio.Queue()
        work = service.start(agent_request, queue.put_nowait, stream_model=True)  # 429 before any byte is sent
        work.future.add_done_callback(lambda _: queue.put_nowait(None))
        return sse.stream(completion.stream(work, queue, len(conversation), options.include_usage, progress))
    run = await service.wait(service.start(agent_request), hung_up(request.receive))
    new = run.messages[len(conversation):]
    if run.error and not final_text(new):
        raise ApiError(502, f"the upstream model failed: {run.error}", "upstream_error")
    return completion.object(final_text(new), "length" if run.partial else "stop", usage_of(run))


class Completion:
    def __init__(self, model: str):
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def object(self, text: str, finish_reason: str, usage: dict[str, int]) -> dict[str, Any]:
        return {**self._head("chat.completion"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": None, "finish_reason": finish_reason}],
                "usage": usage}

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return sse.event({**self._head("chat.completion.chunk"),
                          "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]})

    def progress(self, ev: Event) -> bytes:
        call = ev["call"]
        name, arguments = call["function"]["name"], call["function"]["arguments"] or ""
        # the empty delta: loops reading choices[0].delta pass over it (an empty `choices` broke them)
        data = {**self._head("hermes.tool.progress"),
                "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": None}], "tool": name, "call_id": call["id"],
                "status": "started" if ev["type"] == "tool.started" else "completed",
                "label": f"{name}: {arguments[:LABEL_CHARS]}"}
        if ev["type"] == "tool.completed":
            data["ok"] = not is_tool_failure(ev["result"])
        return sse.event(data, "hermes.tool.progress")

    async def stream(self, work, queue: asyncio.Queue, history: int, include_usage: bool,
                     progress: bool) -> AsyncIterator[bytes]:
        wrote_text = turn_has_text = False
        try:
            yield self.chunk({"role": "assistant", "content": ""})
            while (ev := await sse.next_or_ping(queue)) is not None:
                if isinstance(ev, bytes):
                    yield ev
                elif ev["type"] == "content.delta":
                    # texts of successive model turns are joined by a blank line, as in the
                    # non-streamed answer
                    delta = ("\n\n" if wrote_text and not turn_has_text else "") + ev["delta"]
                    wrote_text = turn_has_text = True
                    yield self.chunk({"content": delta})
                elif ev["type"] == "message":
                    turn_has_text = False
                elif ev["type"] in ("tool.started", "tool.completed") and progress:
                    yield self.progress(ev)
            try:
                run = work.future.result()
            except Exception as e:  # a bug of ours, reported in-band: the status line is long gone
                yield sse.event(error_body(500, f"internal error: {type(e).__name__}", "internal_error"))
                yield sse.DONE
                return
            if run.error and not final_text(run.messages[history:]):
                yield sse.event(error_body(502, f"the upstream model failed: {run.error}", "upstream_error"))
            else:
                yield self.chunk({}, "length" if run.partial else "stop")
                if include_usage:
                    yield sse.event({**self._head("chat.completion.chunk"), "choices": [], "usage": usage_of(run)})
            yield sse.DONE
        finally:
            if not work.future.done():
                work.stop()  # the client left: stop the agent at its next safe point
