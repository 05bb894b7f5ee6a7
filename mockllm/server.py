"""The mock's HTTP server: routes, injected latency and errors, the in-process MockLLM.

aiohttp on one event loop: the benchmarks run the mock on the same two cores as the system they
measure, and at 512 clients a thread per connection (http.server) cost 0.9-1.1 ms of CPU a
request against 0.6-0.7 here (bench/THROUGHPUT.md, session 9)."""
from __future__ import annotations

import asyncio
import logging
import math
import random
import socket
import sys
import threading
import uuid
from typing import Any, Iterable, Iterator

import aiohttp
import aiohttp.http_exceptions
import orjson
from aiohttp import web

from mockllm.conversation import MODEL_ID, BadRequest, MockConfig, parse_conversation
from mockllm.images import ImageAPI
from mockllm.logprobs import add_logprobs
from mockllm.ratelimit import RequestBucket, format_duration
from mockllm.scenario import reply_for
from mockllm.textcalls import as_text
from mockllm.wire import completion_chunks, completion_object, error_body

# --------------------------------------------------------------------------- server state


class MockState:
    """What the server remembers: received requests, counters, fail-first tallies, the RNG."""

    def __init__(self, config: MockConfig):
        self.config = config
        self._lock = threading.Lock()
        self.images = ImageAPI()  # the images API's requests and files
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.requests: list[Any] = []
            self.counts = {"requests": 0, "ok": 0, "errors": 0, "injected_errors": 0, "rate_limited": 0,
                           "bad_requests": 0, "streamed": 0, "in_flight": 0, "max_in_flight": 0}
            self.bucket = RequestBucket(self.config.rpm, self.config.burst) if self.config.rpm else None
            self._attempts: dict[str, int] = {}
            self._visits: dict[str, int] = {}  # first turns seen per opening message (branched scripts)
            self._rng = random.Random(self.config.seed)
        self.images.reset()

    def record(self, body: Any) -> None:
        with self._lock:
            self.requests.append(body)

    def count(self, key: str, delta: int = 1) -> None:
        with self._lock:
            self.counts[key] += delta
            if key == "in_flight":
                self.counts["max_in_flight"] = max(self.counts["max_in_flight"], self.counts["in_flight"])

    def snapshot(self) -> tuple[list[Any], dict[str, int]]:
        with self._lock:
            return list(self.requests), dict(self.counts)

    def latency(self) -> float:
        config = self.config
        if not config.latency_jitter:
            return config.latency
        with self._lock:
            return config.latency + self._rng.uniform(0, config.latency_jitter)

    def visit(self, first_user: str) -> int:
        """Count a conversation's first turn: the how-manieth opening with this user message it is."""
        with self._lock:
            self._visits[first_user] = self._visits.get(first_user, 0) + 1
            return self._visits[first_user]

    def scripted_error_due(self, conversation_key: str, turn: int, times: int | None) -> bool:
        """A scripted turn error with "times": N fails the first N asks of that turn only."""
        if times is None:
            return True
        with self._lock:
            seen = self._attempts.get(f"{turn}\0{conversation_key}", 0)
            self._attempts[f"{turn}\0{conversation_key}"] = seen + 1
        return seen < times

    def injected_error(self, conversation_key: str) -> bool:
        """Should this request fail on purpose (--fail-first, then --error-rate)?"""
        config = self.config
        with self._lock:
            if config.fail_first:
                seen = self._attempts.get(conversation_key, 0)
                self._attempts[conversation_key] = seen + 1
                if seen < config.fail_first:
                    return True
            return config.error_rate > 0 and self._rng.random() < config.error_rate


# --------------------------------------------------------------------------- HTTP

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
SERVER_NAME = "hermes-mock-llm/1"
KEEPALIVE_SECONDS = 120  # idle keep-alive connections are dropped after this
MAX_BODY = 256 << 20     # vision and image-edit requests carry images


class ClientGone(Exception):
    """The client hung up before its whole request body arrived: no request, no answer."""


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(payload),
                        headers={"Content-Type": "application/json", "Server": SERVER_NAME,
                                 "x-request-id": f"req_mock{uuid.uuid4().hex[:16]}", **(headers or {})})


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return json_response(status, error_body(status, message), headers)


async def read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except (ConnectionError, aiohttp.ClientPayloadError, aiohttp.http_exceptions.HttpProcessingError) as exc:
        raise ClientGone() from exc


class Routes:
    """The mock's endpoints. Handlers run on the server's loop; MockState is shared with callers."""

    def __init__(self, state: MockState):
        self.state = state

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/")
        try:
            if request.method == "GET":
                return self.get(request, path)
            if request.method == "POST":
                return await self.post(request, path)
            await read_body(request)
            return error_response(405, f"{request.method} is not supported")
        except ClientGone:
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=400)  # never reaches the client: its connection is closed

    def get(self, request: web.Request, path: str) -> web.StreamResponse:
        state = self.state
        if path == "/health":
            return json_response(200, {"status": "ok"})
        if path in ("/v1/models", "/models"):
            return json_response(200, {"object": "list", "data": [
                {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "hermes-batch"}]})
        if path.startswith(("/v1/models/", "/models/")):  # OpenAI's retrieve-model: the mock serves any name
            return json_response(200, {"id": path.split("/models/", 1)[1],
                                       "object": "model", "created": 0, "owned_by": "hermes-batch"})
        if path == "/_mock/requests":
            return json_response(200, state.snapshot()[0])
        if path == "/_mock/stats":
            return json_response(200, state.snapshot()[1])
        if path == "/_mock/image_requests":
            return json_response(200, state.images.snapshot())
        if path.startswith("/_mock/files/"):
            data = state.images.file(path.rsplit("/", 1)[1])
            if data is None:
                return error_response(404, "no such mock file")
            return web.Response(body=data, headers={"Content-Type": "image/png", "Server": SERVER_NAME})
        if path in (*CHAT_PATHS, "/_mock/reset"):
            return error_response(405, f"use POST for {path}")
        return error_response(404, f"no route for GET {path}")

    async def post(self, request: web.Request, path: str) -> web.StreamResponse:
        state = self.state
        if path in CHAT_PATHS:
            return await self.guarded(self.chat(request))
        if path in ("/v1/images/generations", "/images/generations"):
            return await self.guarded(self.images(request, state.images.generations))
        if path in ("/v1/images/edits", "/images/edits"):
            kind = request.headers.get("Content-Type", "")
            return await self.guarded(self.images(request, lambda raw, host: state.images.edits(kind, raw, host)))
        await read_body(request)
        if path == "/_mock/reset":
            state.reset()
            return json_response(200, {"status": "reset"})
        return error_response(404, f"no route for POST {path}")

    async def guarded(self, handler) -> web.StreamResponse:
        state = self.state
        state.count("in_flight")
        try:
            return await handler
        except (ClientGone, web.HTTPException):  # aiohttp's own answers (413 for a body past MAX_BODY)
            raise
        except ConnectionError as exc:
            raise ClientGone() from exc
        except Exception as exc:  # a bug in the mock must answer, not hang its client
            state.count("errors")
            response = error_response(500, f"mock server error: {type(exc).__name__}: {exc}")
            response.force_close()
            return response
        finally:
            state.count("in_flight", -1)

    async def images(self, request: web.Request, answer) -> web.StreamResponse:
        raw = await read_body(request)
        host = request.headers.get("Host") or "%s:%d" % request.transport.get_extra_info("sockname")[:2]
        return json_response(*answer(raw, host))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        state = self.state
        state.count("requests")
        extra: dict[str, str] = {}
        if state.bucket is not None:
            # The cap is checked on arrival and a refusal is answered at once, as providers do.
            allowed, wait, headers = state.bucket.take()
            if state.config.ratelimit_headers:
                extra = headers
            if not allowed:
                await read_body(request)
                state.count("rate_limited")
                state.count("errors")
                return error_response(
                    429, f"Rate limit reached for requests per min (RPM): Limit {state.config.rpm:g}. "
                         f"Please try again in {format_duration(wait)}.",
                    {**extra, "Retry-After": str(max(1, math.ceil(wait))),
                     "retry-after-ms": str(max(1, round(wait * 1000)))})
        raw = await read_body(request)
        try:
            body = orjson.loads(raw or b"null")
        except orjson.JSONDecodeError as exc:
            return self.failure(400, f"request body is not valid JSON: {exc}", extra)
        state.record(body)
        try:
            conv = parse_conversation(body)
            conv.visits = state.visit  # branched scripts count conversations (mockllm.branches)
            reply = as_text(reply_for(conv, state.config), state.config.tool_calls)
        except BadRequest as exc:
            return self.failure(400, str(exc), extra)
        await asyncio.sleep(state.latency() + reply.sleep)
        if state.injected_error(conv.first_user):
            state.count("injected_errors")
            return self.failure(state.config.error_status, "injected failure (mock-llm --fail-first / --error-rate)",
                                extra)
        if reply.error_status and state.scripted_error_due(conv.first_user, conv.assistant_turns, reply.error_times):
            return self.failure(reply.error_status,
                                f"scripted failure of turn (MOCK_SCRIPT error {reply.error_status})", extra)
        state.count("ok")
        if not body.get("stream"):
            return json_response(200, add_logprobs(completion_object(body, reply, state.config.reasoning), body), extra)
        state.count("streamed")
        return await self.stream(request, completion_chunks(body, reply, state.config.reasoning), extra)

    def failure(self, status: int, message: str, extra: dict[str, str]) -> web.Response:
        state = self.state
        state.count("errors")
        if status == 400:
            state.count("bad_requests")
        headers = dict(extra)
        if status in (429, 503):
            seconds = state.config.retry_after
            headers.update({"Retry-After": _format_seconds(seconds), "retry-after-ms": str(int(seconds * 1000))})
        return error_response(status, message, headers)

    async def stream(self, request: web.Request, chunks: Iterator[dict], extra: dict[str, str]) -> web.StreamResponse:
        """Server-sent events over chunked transfer encoding (so keep-alive still works)."""
        response = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", "Server": SERVER_NAME,
            **extra})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for chunk in chunks:
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def make_app(state: MockState, middlewares: Iterable[Any] = ()) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY, middlewares=list(middlewares))
    app.router.add_route("*", "/{tail:.*}", Routes(state).dispatch)
    return app


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # uvloop is not on every platform
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


# --------------------------------------------------------------------------- in-process API


class MockLLM:
    """The mock server, on an event loop in a background thread.

    ``MockLLM(port=0, host="127.0.0.1", **MockConfig fields)``; ``start()`` returns the base_url
    (``http://HOST:PORT/v1``), ``stop()`` shuts it down; as a context manager it yields itself
    started. ``requests()``, ``stats()`` and ``reset()`` mirror the ``/_mock/*`` endpoints.
    ``middlewares`` are aiohttp middlewares put before the mock's routes (the benchmark's clock).
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", config: MockConfig | None = None,
                 middlewares: Iterable[Any] = (), **options: Any):
        if config is not None and options:
            raise TypeError("pass either config or keyword options, not both")
        self.config = config or MockConfig(**options)
        self.host, self.port = host, port
        self.state = MockState(self.config)
        self._middlewares = list(middlewares)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Root URL of the server (``/health``, ``/_mock/*`` live here)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base_url: ``http://HOST:PORT/v1``."""
        return f"{self.url}/v1"

    def start(self) -> str:
        if self._runner is not None:
            return self.base_url
        # The socket is bound here, so a taken port is an OSError in the caller, not in the thread.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self.port), family=family, backlog=512)
        self.port = sock.getsockname()[1]
        loop = _new_loop()
        access = logging.getLogger("mockllm.access")
        if self.config.verbose and not access.handlers:
            access.addHandler(logging.StreamHandler(sys.stderr))
            access.setLevel(logging.INFO)
        runner = web.AppRunner(make_app(self.state, self._middlewares), handle_signals=False,
                               access_log=access if self.config.verbose else None,
                               keepalive_timeout=KEEPALIVE_SECONDS, shutdown_timeout=0.5)
        try:
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.SockSite(runner, sock, backlog=512).start())
        except BaseException:
            sock.close()
            loop.close()
            raise
        self._loop, self._runner = loop, runner
        self._thread = threading.Thread(target=loop.run_forever, name=f"mock-llm:{self.port}", daemon=True)
        self._thread.start()
        return self.base_url

    def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        loop, thread = self._loop, self._thread
        try:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            if not thread.is_alive():
                loop.close()
            self._loop = self._thread = None

    def requests(self) -> list[Any]:
        return self.state.snapshot()[0]

    def image_requests(self) -> list[dict]:
        """Every images API request: endpoint, prompt, size, response_format and the uploaded images' digests."""
        return self.state.images.snapshot()

    def stats(self) -> dict[str, int]:
        return self.state.snapshot()[1]

    def reset(self) -> None:
        self.state.reset()

    def __enter__(self) -> "MockLLM":
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
