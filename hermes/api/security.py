"""The server's outer layers, as plain ASGI middleware so they also cover streamed answers,
router errors and preflights:

- SecurityHeaders: nosniff and no-referrer on every response.
- CORS: Starlette's, answering refused preflights with an OpenAI-style body.
- BodyLimit: refuses bodies over the limit (413) whether or not they declare a length.
- BearerAuth: the API key, compared in constant time. A middleware rather than a FastAPI
  dependency because FastAPI parses the body before dependencies run: an unauthenticated
  client must learn nothing about its request, not even that its JSON is malformed.
"""
from __future__ import annotations

import hmac
from typing import Iterable

from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hermes.api.errors import SECURITY_HEADERS, ApiError, error_body

#: reachable without a key: liveness probes
PUBLIC_PATHS = frozenset({"/health", "/v1/health"})


class SecurityHeaders:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


#: request headers a browser may send: ours, and those the official OpenAI SDKs (Python,
#: openai-node 4.x-6.x) add to every request, so a browser app using them passes the preflight
ALLOWED_HEADERS = [
    "Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID",
    "OpenAI-Organization", "OpenAI-Project", "OpenAI-Beta",
    "X-Stainless-Arch", "X-Stainless-Lang", "X-Stainless-OS", "X-Stainless-Package-Version",
    "X-Stainless-Runtime", "X-Stainless-Runtime-Version", "X-Stainless-Retry-Count", "X-Stainless-Timeout",
    "X-Stainless-Read-Timeout", "X-Stainless-Async", "X-Stainless-Helper-Method", "X-Stainless-Helper",
    "X-Stainless-Poll-Helper", "X-Stainless-Custom-Poll-Interval",
]


class Cors(CORSMiddleware):
    """CORS for an explicit allowlist; preflights are cached 10 minutes and may carry
    Idempotency-Key and the OpenAI SDKs' headers. A refused preflight gets an OpenAI-style body
    instead of plain text."""

    def __init__(self, app: ASGIApp, origins: Iterable[str]):
        super().__init__(app, allow_origins=list(origins), allow_methods=["GET", "POST", "PATCH", "DELETE", "OPTIONS"],
                         allow_headers=ALLOWED_HEADERS,
                         expose_headers=["Retry-After", "Idempotent-Replayed"], max_age=600)

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        reason = response.body.decode("utf-8", "replace")
        headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
        return JSONResponse(error_body(400, reason, "cors_refused"), 400, headers=headers)


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def too_large(self) -> ApiError:
        return ApiError(413, f"request body larger than {self.max_bytes} bytes", "request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            if not declared.isdigit():
                return await ApiError(400, "invalid Content-Length header", "invalid_request").response()(scope, receive, send)
            if int(declared) > self.max_bytes:
                return await self.too_large().response()(scope, receive, send)
        seen = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # a chunked body that never said how long it was
                    raise self.too_large()
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except ApiError as e:  # raised while a middleware (not a route) read the body
            if started:
                raise
            await e.response()(scope, receive, send)


class BearerAuth:
    def __init__(self, app: ASGIApp, key: str | None):
        self.app = app
        self.key = key.encode("utf-8") if key else None

    def allowed(self, scope: Scope) -> bool:
        if self.key is None or scope["path"] in PUBLIC_PATHS:
            return True
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        # compare_digest: the time taken must not tell an attacker how much of the key matched
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("utf-8"), self.key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.allowed(scope):
            return await self.app(scope, receive, send)
        response = ApiError(401, "invalid or missing API key: send 'Authorization: Bearer <API_SERVER_KEY>'",
                            "invalid_api_key", headers={"WWW-Authenticate": "Bearer"}).response()
        await response(scope, receive, send)
