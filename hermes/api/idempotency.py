"""Idempotency-Key: a retried POST gets the first answer again instead of a second agent run.

Answers are kept `ttl` seconds per (path, key). The same key with a different body is refused
(409) rather than silently answered with a result for another request; a retry that arrives
while the first attempt is still running waits for it. Only completed answers (2xx, not
streamed) are kept: a refusal (429 because the server was full, 4xx, 5xx) must not stand in
for the answer a retry with the same key may well get, and a stream cannot be replayed
faithfully.
"""
from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hermes.api.errors import ApiError

MAX_KEY_LENGTH = 255


@dataclass
class _Entry:
    digest: str
    expires: float
    done: asyncio.Event = field(default_factory=asyncio.Event)
    start: Message | None = None
    body: bytes = b""
    cacheable: bool = False


class Idempotency:
    def __init__(self, app: ASGIApp, ttl: float, max_entries: int = 2048):
        self.app, self.ttl, self.max_entries = app, ttl, max_entries
        self.entries: dict[tuple[str, str], _Entry] = {}

    def _purge(self) -> None:
        now = time.monotonic()
        for k in [k for k, e in self.entries.items() if e.done.is_set() and e.expires < now]:
            del self.entries[k]
        while len(self.entries) > self.max_entries:  # oldest finished entries go first
            oldest = next((k for k, e in self.entries.items() if e.done.is_set()), None)
            if oldest is None:
                break
            del self.entries[oldest]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = Headers(scope=scope).get("idempotency-key") if scope["type"] == "http" else None
        if key is None or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        if not key or len(key) > MAX_KEY_LENGTH:
            return await ApiError(400, f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters",
                                  "invalid_idempotency_key").response()(scope, receive, send)
        body = await _read_body(receive)
        digest = hashlib.sha256(body).hexdigest()
        cache_key = (scope["path"], key)
        while True:
            self._purge()
            entry = self.entries.get(cache_key)
            if entry is None:
                break
            if entry.digest != digest:
                return await ApiError(409, "this Idempotency-Key was already used with a different request body",
                                      "idempotency_key_reused").response()(scope, receive, send)
            await entry.done.wait()
            if entry.cacheable:
                return await _replay(entry, send)
            # the first attempt left nothing to replay (a stream, an error): this one runs anew
            if self.entries.get(cache_key) is entry:
                del self.entries[cache_key]
        entry = self.entries[cache_key] = _Entry(digest, time.monotonic() + self.ttl)
        try:
            await self._run(scope, body, receive, send, entry)
        finally:
            entry.expires = time.monotonic() + self.ttl
            if not entry.cacheable:
                self.entries.pop(cache_key, None)
            entry.done.set()

    async def _run(self, scope: Scope, body: bytes, receive: Receive, send: Send, entry: _Entry) -> None:
        sent = False

        async def replay_receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # the body is consumed: what comes now is the client leaving

        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                entry.start = message
                content_type = Headers(raw=message.get("headers", [])).get("content-type", "")
                entry.cacheable = 200 <= message["status"] < 300 and not content_type.startswith("text/event-stream")
            elif message["type"] == "http.response.body" and entry.cacheable:
                chunks.append(message.get("body", b""))
            await send(message)

        await self.app(scope, replay_receive, capture)
        entry.body = b"".join(chunks)


async def _read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)


async def _replay(entry: _Entry, send: Send) -> None:
    assert entry.start is not None
    headers = [(k, v) for k, v in entry.start.get("headers", []) if k.lower() != b"content-length"]
    headers += [(b"content-length", str(len(entry.body)).encode()), (b"idempotent-replayed", b"true")]
    await send({"type": "http.response.start", "status": entry.start["status"], "headers": headers})
    await send({"type": "http.response.body", "body": entry.body, "more_body": False})
