"""Server-sent events: FastAPI's wire encoding, a keep-alive while tools run, one response type."""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

from fastapi.sse import KEEPALIVE_COMMENT, EventSourceResponse, format_sse_event

#: seconds of silence after which a comment line keeps proxies from closing the stream
KEEPALIVE_SECONDS = 15.0

DONE = format_sse_event(data_str="[DONE]")


def event(data: Any, name: str | None = None, id: str | None = None) -> bytes:
    return format_sse_event(data_str=json.dumps(data, ensure_ascii=False), event=name, id=id)


def stream(body: AsyncIterator[bytes]) -> EventSourceResponse:
    # no-transform / X-Accel-Buffering: proxies must pass each event on at once
    return EventSourceResponse(body, headers={"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"})


async def next_or_ping(queue: asyncio.Queue) -> Any:
    """The next queued item, or KEEPALIVE_COMMENT after a quiet spell."""
    try:
        return await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
    except asyncio.TimeoutError:
        return KEEPALIVE_COMMENT
