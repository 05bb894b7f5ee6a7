"""A test's own OpenAI-compatible server on loopback: the test says how each request is answered
(`answer(method, path, body) -> (status, payload)`), and every request's body is kept in order.

For what the bundled mock does not do on purpose: refuse a key, not know a model, die mid-run,
say the context is too long, read exactly what a run sent."""
from __future__ import annotations

import http.server
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

Answer = Callable[[str, str, Any], "tuple[int, Any]"]


def completion(content: str = "Done.", reasoning: str | None = "Thinking.", **extra: Any) -> dict[str, Any]:
    """A chat completion object as OpenAI's wire format has it."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning"] = reasoning
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": "test",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop", **extra}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


@dataclass
class Raw:
    """An answer's bytes as they go out, for what is not one JSON object (a stream of events)."""

    data: bytes
    kind: str = "text/event-stream"


def error(status: int, message: str, code: str | None = None) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"message": message, "type": "invalid_request_error", "code": code}}


class WireServer:
    def __init__(self, answer: Answer):
        server = self
        self.answer = answer
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, parsed body or None)
        self._lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else None
                with server._lock:
                    server.requests.append((self.command, self.path, body))
                status, payload = server.answer(self.command, self.path, body)
                data, kind = (payload.data, payload.kind) if isinstance(payload, Raw) else (
                    json.dumps(payload).encode(), "application/json")
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up waiting (a time-out under test) and closed the connection

            do_GET = do_POST = _serve

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def chat_bodies(self) -> list[dict[str, Any]]:
        with self._lock:
            return [b for m, p, b in self.requests if m == "POST" and p.endswith("/chat/completions")]

    def __enter__(self) -> "WireServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
