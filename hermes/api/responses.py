"""POST /v1/responses, GET and DELETE /v1/responses/{id}: the OpenAI Responses API.

A request continues a stored response (`previous_response_id`) or a named `conversation`
(never both); its `instructions` are layered on the agent's system prompt for this request
only. The output lists what the agent did, in order: `message` items for its text,
`function_call` and `function_call_output` items for each tool call and its result. Streams
carry the Responses event types, items appearing as the agent works.

Responses are stored unless `store` is false; a response in a named conversation is always
stored, since the conversation is made of stored responses. A conversation whose latest
response was evicted from the store answers 409 `conversation_expired` rather than going on
without its history.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Annotated, Any, AsyncIterator

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, WithJsonSchema

from hermes.api import sse
from hermes.api.content import TextOnly, responses_input
from hermes.api.errors import ApiError, not_found
from hermes.api.service import AgentRequest, AgentService, Event, hung_up, usage_of
from hermes.api.response_store import ResponseStore
from hermes.api.wire_schemas import RESPONSES_INPUT, not_both

router = APIRouter()


class ConversationRef(BaseModel):
    id: str = Field(min_length=1)

#: Responses input (content.responses_input checks it; the document says the same)
Input = Annotated[str | list[dict[str, Any]], WithJsonSchema(RESPONSES_INPUT)]


class ResponsesRequest(TextOnly):
    # sampling parameters etc. are allowed: the server decides
    model_config = ConfigDict(extra="allow", json_schema_extra=not_both("previous_response_id", "conversation"))

    model: str | None = None
    input: Input
    instructions: str | None = None
    store: StrictBool = True
    previous_response_id: str | None = Field(None, min_length=1)
    conversation: Annotated[str, Field(min_length=1)] | ConversationRef | None = None
    stream: StrictBool = False
    metadata: dict[str, str] | None = None


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class Output:
    """Builds a response's output items from agent events; yields the stream events on the way."""

    def __init__(self, response: dict[str, Any]):
        self.response = response
        self.items: list[dict[str, Any]] = []
        self.seq = 0
        self._text: dict[str, Any] | None = None  # the message item whose text is streaming

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse.event(data, kind)

    def _add(self, item: dict[str, Any]) -> list[bytes]:
        self.items.append(item)
        # announced as in progress; a message's text arrives afterwards, part by part
        announced = {**item, "status": "in_progress", **({"content": []} if item["type"] == "message" else {})}
        return [self.event("response.output_item.added", output_index=len(self.items) - 1, item=announced)]

    def _done(self, item: dict[str, Any]) -> bytes:
        return self.event("response.output_item.done", output_index=self.items.index(item), item=item)

    def _open_text(self) -> list[bytes]:
        item = {"type": "message", "id": _id("msg"), "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "", "annotations": []}]}
        self._text = item
        out = self._add(item)
        out.append(self.event("response.content_part.added", item_id=item["id"], output_index=len(self.items) - 1,
                              content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
        return out

    def _close_text(self, text: str) -> list[bytes]:
        item, self._text = self._text, None
        if item is None:
            return []
        part = item["content"][0]
        part["text"] = text
        index = self.items.index(item)
        return [self.event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                           text=text, logprobs=[]),
                self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                           part=part),
                self._done(item)]

    def feed(self, ev: Event) -> list[bytes]:
        kind = ev["type"]
        if kind == "content.delta":
            out = [] if self._text else self._open_text()
            item = self._text
            assert item is not None
            item["content"][0]["text"] += ev["delta"]
            out.append(self.event("response.output_text.delta", item_id=item["id"], output_index=self.items.index(item),
                                  content_index=0, delta=ev["delta"], logprobs=[]))
            return out
        if kind == "message":
            message = ev["message"]
            text = message.get("content") if isinstance(message.get("content"), str) else ""
            out = []
            if text and not self._text:  # not streamed: the whole text at once
                out += self._open_text()
                out.append(self.event("response.output_text.delta", item_id=self._text["id"],
                                      output_index=len(self.items) - 1, content_index=0, delta=text, logprobs=[]))
            out += self._close_text(text or "")
            for call in message.get("tool_calls") or []:
                item = {"type": "function_call", "id": _id("fc"), "call_id": call["id"],
                        "name": call["function"]["name"], "arguments": call["function"]["arguments"] or "",
                        "status": "completed"}
                out += self._add(item)
                out.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=len(self.items) - 1, arguments=item["arguments"]))
                out.append(self._done(item))
            return out
        if kind == "tool.completed":
            item = {"type": "function_call_output", "id": _id("fco"), "call_id": ev["call"]["id"],
                    "output": ev["result"], "status": "completed"}
            return self._add(item) + [self._done(item)]
        return []


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request):
    state = request.app.state
    store: ResponseStore = state.store
    service: AgentService = state.service
    if body.previous_response_id is not None and body.conversation is not None:
        raise ApiError(400, "send previous_response_id or conversation, not both", "invalid_request", "conversation")
    conversation = body.conversation.id if isinstance(body.conversation, ConversationRef) else body.conversation
    previous = None
    if body.previous_response_id is not None:
        previous = store.get(body.previous_response_id)
        if previous is None:
            raise not_found("previous response", body.previous_response_id, "previous_response_id")
    elif conversation:
        latest, evicted = store.latest(conversation)
        previous = store.get(latest) if latest else None  # a new name starts a new conversation
        if latest and previous is None:
            # never start over silently: the client would think the model still knew the history
            raise ApiError(409, f"conversation '{conversation}' cannot be continued: its latest response {latest} "
                           f"was {'evicted from the store (max_stored_responses)' if evicted else 'removed'}; "
                           "start a new conversation, or send the history in `input`",
                           "conversation_expired", "conversation")
    new, system = responses_input(body.input)
    messages = (previous.messages if previous else []) + new
    instructions = "\n\n".join(s for s in (body.instructions, system) if s) or None
    response = {
        "id": _id("resp"), "object": "response", "created_at": int(time.time()), "status": "in_progress",
        "model": state.settings.model_name, "output": [], "instructions": body.instructions,
        "previous_response_id": previous.id if previous else None,
        "conversation": {"id": conversation} if conversation else None,
        "store": body.store or bool(conversation), "metadata": body.metadata or {}, "error": None,
        "incomplete_details": None, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "text": {"format": {"type": "text"}}, "usage": None,
    }
    output = Output(response)
    agent_request = AgentRequest(messages, instructions)
    if body.stream:
        queue: asyncio.Queue = asyncio.Queue()
        work = service.start(agent_request, queue.put_nowait, stream_model=True)
        work.future.add_done_callback(lambda _: queue.put_nowait(None))
        return sse.stream(_stream(work, queue, output, messages, conversation, store))
    events: list[Event] = []
    run = await service.wait(service.start(agent_request, events.append), hung_up(request.receive))
    for ev in events:
        output.feed(ev)
    if run.error and not output.items:
        raise ApiError(502, f"the upstream model failed: {run.error}", "upstream_error")
    _finish(response, output, run)
    if response["store"]:
        store.put(response["id"], response, run.messages, conversation)
    return response


def _finish(response: dict[str, Any], output: Output, run: Any) -> None:
    u = usage_of(run)
    response["output"] = output.items
    response["usage"] = {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
                         "total_tokens": u["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                         "output_tokens_details": {"reasoning_tokens": 0}}
    if run.error:
        response["status"] = "failed"
        response["error"] = {"code": "server_error", "message": f"the upstream model failed: {run.error}"}
    elif run.cancelled:
        response["status"] = "cancelled"
    elif run.partial:
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_turns"}
    else:
        response["status"] = "completed"


async def _stream(work, queue: asyncio.Queue, output: Output, messages: list[dict[str, Any]],
                  conversation: str | None, store: ResponseStore) -> AsyncIterator[bytes]:
    response = output.response
    try:
        yield output.event("response.created", response=response)
        yield output.event("response.in_progress", response=response)
        while (ev := await sse.next_or_ping(queue)) is not None:
            for chunk in ([ev] if isinstance(ev, bytes) else output.feed(ev)):
                yield chunk
        try:
            run = work.future.result()
        except Exception as e:  # a bug of ours, reported in-band
            response["status"] = "failed"
            response["error"] = {"code": "server_error", "message": f"internal error: {type(e).__name__}"}
            yield output.event("response.failed", response=response)
            return
        _finish(response, output, run)
        if response["store"] and not run.error:
            store.put(response["id"], response, run.messages, conversation)
        final = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(response["status"], "response.failed")
        yield output.event(final, response=response)
    finally:
        if not work.future.done():
            work.stop()


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request):
    stored = request.app.state.store.get(response_id)
    if stored is None:
        raise not_found("response", response_id)
    return stored.response


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request):
    if not request.app.state.store.delete(response_id):
        raise not_found("response", response_id)
    return {"id": response_id, "object": "response", "deleted": True}
