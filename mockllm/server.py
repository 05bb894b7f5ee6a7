"""The mock's HTTP server: routes, injected latency and errors, the in-process MockLLM."""
from __future__ import annotations

import json
import math
import random
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

from mockllm.conversation import MODEL_ID, BadRequest, MockConfig, parse_conversation
from mockllm.images import ImageAPI
from mockllm.ratelimit import RequestBucket, format_duration
from mockllm.scenario import reply_for
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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512      # many concurrent clients connect at once
    state: MockState

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # clients hanging up is normal
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive, so client connection pools work
    server_version = "hermes-mock-llm/1"
    timeout = 120                   # idle keep-alive connections are dropped after this
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid 40 ms delayed-ACK stalls
    _extra_headers: dict[str, str] = {}  # rate-limit headers of the request being answered (never mutated)
    server: _Server

    # ----- routing

    def do_GET(self) -> None:
        self._extra_headers = {}  # the handler lives as long as its connection
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            self._send_json(200, {"status": "ok"})
        elif path in ("/v1/models", "/models"):
            self._send_json(200, {"object": "list", "data": [
                {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "hermes-batch"}]})
        elif path == "/_mock/requests":
            self._send_json(200, self.server.state.snapshot()[0])
        elif path == "/_mock/stats":
            self._send_json(200, self.server.state.snapshot()[1])
        elif path == "/_mock/image_requests":
            self._send_json(200, self.server.state.images.snapshot())
        elif path.startswith("/_mock/files/"):
            self._send_file(self.server.state.images.file(path.rsplit("/", 1)[1]))
        elif path in ("/v1/chat/completions", "/chat/completions", "/_mock/reset"):
            self._send_error(405, f"use POST for {path}")
        else:
            self._send_error(404, f"no route for GET {path}")

    def do_POST(self) -> None:
        self._extra_headers = {}
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/v1/chat/completions", "/chat/completions"):
            self._guarded(self._chat)
        elif path in ("/v1/images/generations", "/images/generations"):
            self._guarded(lambda: self._send_json(*self.server.state.images.generations(self._read_body(), self._host())))
        elif path in ("/v1/images/edits", "/images/edits"):
            self._guarded(lambda: self._send_json(*self.server.state.images.edits(
                self.headers.get("Content-Type", ""), self._read_body(), self._host())))
        elif path == "/_mock/reset":
            self._read_body()
            self.server.state.reset()
            self._send_json(200, {"status": "reset"})
        else:
            self._read_body()
            self._send_error(404, f"no route for POST {path}")

    # ----- chat completions

    def _guarded(self, handler) -> None:
        state = self.server.state
        state.count("in_flight")
        try:
            handler()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug in the mock must not kill the connection silently
            state.count("errors")
            self.close_connection = True
            try:
                self._send_error(500, f"mock server error: {type(exc).__name__}: {exc}")
            except OSError:
                pass
        finally:
            state.count("in_flight", -1)

    def _chat(self) -> None:
        state = self.server.state
        state.count("requests")
        if state.bucket is not None:
            # The cap is checked on arrival and a refusal is answered at once, as providers do.
            allowed, wait, headers = state.bucket.take()
            if state.config.ratelimit_headers:
                self._extra_headers = headers
            if not allowed:
                self._read_body()
                state.count("rate_limited")
                state.count("errors")
                return self._send_error(429, f"Rate limit reached for requests per min (RPM): Limit {state.config.rpm:g}. "
                                             f"Please try again in {format_duration(wait)}.",
                                        {"Retry-After": str(max(1, math.ceil(wait))),
                                         "retry-after-ms": str(max(1, round(wait * 1000)))})
        raw, length = self._read_body(), self.headers.get("Content-Length", "")
        if length.isdigit() and len(raw) < int(length):
            # the client went away before its whole body arrived (killed mid-request): no request, no answer
            self.close_connection = True
            return None
        try:
            body = json.loads(raw or b"null")
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return self._bad_request(f"request body is not valid JSON: {exc}")
        state.record(body)
        try:
            conv = parse_conversation(body)
            reply = reply_for(conv, state.config)
        except BadRequest as exc:
            return self._bad_request(str(exc))
        time.sleep(state.latency() + reply.sleep)
        if state.injected_error(conv.first_user):
            state.count("injected_errors")
            return self._fail(state.config.error_status, "injected failure (mock-llm --fail-first / --error-rate)")
        if reply.error_status and state.scripted_error_due(conv.first_user, conv.assistant_turns, reply.error_times):
            return self._fail(reply.error_status, f"scripted failure of turn (MOCK_SCRIPT error {reply.error_status})")
        state.count("ok")
        if body.get("stream"):
            state.count("streamed")
            self._send_stream(completion_chunks(body, reply, state.config.reasoning))
        else:
            self._send_json(200, completion_object(body, reply, state.config.reasoning))

    def _bad_request(self, message: str) -> None:
        self.server.state.count("bad_requests")
        self._fail(400, message)

    def _fail(self, status: int, message: str) -> None:
        self.server.state.count("errors")
        headers = {}
        if status in (429, 503):
            seconds = self.server.state.config.retry_after
            headers = {"Retry-After": _format_seconds(seconds), "retry-after-ms": str(int(seconds * 1000))}
        self._send_error(status, message, headers)

    # ----- I/O

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True  # not supported; the unread body would corrupt keep-alive
            return b""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            return b""
        return self.rfile.read(length) if length > 0 else b""

    def _send_error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self._send_json(status, error_body(status, message), headers)

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", f"req_mock{uuid.uuid4().hex[:16]}")
        for name, value in {**self._extra_headers, **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _host(self) -> str:
        return self.headers.get("Host") or "%s:%d" % self.server.server_address[:2]

    def _send_file(self, data: bytes | None) -> None:
        if data is None:
            return self._send_error(404, "no such mock file")
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, chunks: Iterator[dict]) -> None:
        """Server-sent events over chunked transfer encoding (so keep-alive still works)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in self._extra_headers.items():
            self.send_header(name, value)
        self.end_headers()
        for chunk in chunks:
            self._write_chunk(f"data: {json.dumps(chunk)}\n\n".encode("utf-8"))
        self._write_chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode("ascii") + data + b"\r\n")

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.state.config.verbose:
            super().log_message(format, *args)


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


# --------------------------------------------------------------------------- in-process API


class MockLLM:
    """The mock server, in a background thread.

    ``MockLLM(port=0, host="127.0.0.1", **MockConfig fields)``; ``start()`` returns the base_url
    (``http://HOST:PORT/v1``), ``stop()`` shuts it down; as a context manager it yields itself
    started. ``requests()``, ``stats()`` and ``reset()`` mirror the ``/_mock/*`` endpoints.
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", config: MockConfig | None = None, **options: Any):
        if config is not None and options:
            raise TypeError("pass either config or keyword options, not both")
        self.config = config or MockConfig(**options)
        self.host, self.port = host, port
        self.state = MockState(self.config)
        self._server: _Server | None = None
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
        if self._server is not None:
            return self.base_url
        server = _Server((self.host, self.port), _Handler)
        server.state = self.state
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"mock-llm:{self.port}", daemon=True)
        self._thread.start()
        return self.base_url

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

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

