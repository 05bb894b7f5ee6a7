"""The bundled scripted model server (mockllm), with timestamps for the benchmark.

    python -m bench.mockserver --port 0 --latency 0 --turns 3

Runs this tree's `mockllm` in its own process (so its CPU is charged to neither system), whichever
commit of ours is measured: the endpoint is the same for both sides of an A/B. A middleware adds
one read-only endpoint, ``GET /_bench/times``: the wall-clock time (time.time()) of the first and
last chat request, how many arrived, and how many other paths were asked for (the reference
probes ``/api/show``, which the mock answers 404 at once).
"""
from __future__ import annotations

import sys
import time
from collections import Counter

from aiohttp import web

from mockllm import server as mock_llm
from mockllm.cli import main as mock_main

# The mock's requests are all handled on its one event loop: these need no lock.
_times = {"first": None, "last": None, "chat": 0, "stream": 0}
_other: Counter = Counter()
_KNOWN = {"GET": ("/health", "/v1/models", "/models", "/_mock/stats", "/_mock/requests"),
          "POST": (*mock_llm.CHAT_PATHS, "/_mock/reset")}


@web.middleware
async def clock(request: web.Request, handler):
    path = request.path.rstrip("/")
    if request.method == "GET" and path == "/_bench/times":
        return mock_llm.json_response(200, {**_times, "other_paths": dict(_other)})
    if request.method == "POST" and path in mock_llm.CHAT_PATHS:
        now = time.time()
        if _times["first"] is None:
            _times["first"] = now
        _times["last"] = now
        _times["chat"] += 1
    elif path not in _KNOWN.get(request.method, ()):
        _other[f"{request.method} {path}"] += 1
    return await handler(request)


if __name__ == "__main__":
    sys.exit(mock_main(sys.argv[1:], middlewares=[clock]))
