"""The bundled scripted model server (mockllm), with timestamps for the benchmark.

    python -m bench.mockserver --port 0 --latency 0 --turns 3

Runs `mockllm` unchanged, in its own process (so its CPU is charged to neither system),
and adds one read-only endpoint, ``GET /_bench/times``: the wall-clock time (time.time()) of the
first and last chat request, how many arrived, and how many other paths were asked for (the
reference probes ``/api/show``, which the mock answers 404 at once).
"""
from __future__ import annotations

import os as _os
import sys as _sys

if _os.environ.get("HERMES_BENCH_SRC"):  # measure the benchmark's snapshot of the product, not the live tree
    _sys.path.insert(0, _os.environ["HERMES_BENCH_SRC"])

import sys
import threading
import time
from collections import Counter

from mockllm import server as mock_llm
from mockllm.cli import main as mock_main

_lock = threading.Lock()
_times = {"first": None, "last": None, "chat": 0, "stream": 0}
_other: Counter = Counter()

_orig_chat = mock_llm._Handler._chat
_orig_get = mock_llm._Handler.do_GET
_orig_post = mock_llm._Handler.do_POST


def _chat(self) -> None:
    now = time.time()
    with _lock:
        if _times["first"] is None:
            _times["first"] = now
        _times["last"] = now
        _times["chat"] += 1
    _orig_chat(self)


def _path(self) -> str:
    return self.path.split("?", 1)[0].rstrip("/")


def do_GET(self) -> None:
    path = _path(self)
    if path == "/_bench/times":
        with _lock:
            payload = {**_times, "other_paths": dict(_other)}
        self._send_json(200, payload)
        return
    if path not in ("/health", "/v1/models", "/models", "/_mock/stats", "/_mock/requests"):
        with _lock:
            _other[f"GET {path}"] += 1
    _orig_get(self)


def do_POST(self) -> None:
    path = _path(self)
    if path not in ("/v1/chat/completions", "/chat/completions", "/_mock/reset"):
        with _lock:
            _other[f"POST {path}"] += 1
    _orig_post(self)


mock_llm._Handler._chat = _chat
mock_llm._Handler.do_GET = do_GET
mock_llm._Handler.do_POST = do_POST


if __name__ == "__main__":
    sys.exit(mock_main(sys.argv[1:]))
