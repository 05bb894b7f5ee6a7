"""``hermes-batch mock-llm`` / ``python -m mockllm``: serve the scripted model until stopped."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any, Sequence

from mockllm.conversation import HALLUCINATED_TOOL, REASONING_MODES, TOOL_CALL_MODES
from mockllm.server import MockLLM

# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hermes-batch mock-llm",
        description="Serve a scripted OpenAI-compatible chat model (see `python -m pydoc mockllm`).",
    )
    add = parser.add_argument
    add("--port", type=int, default=0, help="port to listen on (0 = any free port; the URL is printed)")
    add("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    add("--latency", type=float, default=0.0, metavar="S", help="seconds to sleep before each answer")
    add("--latency-jitter", type=float, default=0.0, metavar="S", help="plus a random 0..S seconds")
    add("--error-rate", type=float, default=0.0, metavar="P", help="share of requests that fail (seeded)")
    add("--fail-first", type=int, default=0, metavar="N", help="the first N requests of each conversation fail")
    add("--error-status", type=int, default=500, choices=(429, 500, 503), help="status of injected errors")
    add("--retry-after", type=float, default=1.0, metavar="S", help="Retry-After seconds on 429/503")
    add("--reasoning", default="field", choices=REASONING_MODES, help="how reasoning is sent (default field)")
    add("--seed", type=int, default=0, help="seed for --error-rate, --latency-jitter, --hallucinate-rate")
    add("--turns", type=int, default=3, metavar="N", help="model calls per prompt in the default scenario")
    add("--hallucinate-rate", type=float, default=0.0, metavar="P",
        help=f"share of conversations that also call the unknown tool {HALLUCINATED_TOOL}")
    add("--rpm", type=float, default=0.0, metavar="R",
        help="answer 429 beyond R requests a minute (token bucket; x-ratelimit-* headers on every answer)")
    add("--burst", type=int, default=0, metavar="N", help="most requests --rpm takes at once (default: one second's worth)")
    add("--no-ratelimit-headers", dest="ratelimit_headers", action="store_false",
        help="with --rpm, send only Retry-After on a 429, no x-ratelimit-* headers")
    add("--tool-calls", default="native", choices=TOOL_CALL_MODES,
        help="how the scripted calls are sent: native tool_calls, written as text in a model family's format "
             "(as a server without a tool parser returns them), or never (prose only); see mockllm.textcalls")
    add("--verbose", action="store_true", help="log every HTTP request to stderr")
    return parser


def main(argv: list[str] | None = None, middlewares: Sequence[Any] = ()) -> int:
    """middlewares: aiohttp middlewares put before the mock's routes (the benchmark's clock)."""
    args = build_parser().parse_args(argv)
    options = {k: v for k, v in vars(args).items() if k not in ("port", "host")}
    try:
        llm = MockLLM(port=args.port, host=args.host, middlewares=middlewares, **options)
        base_url = llm.start()
    except (ValueError, OSError) as exc:
        print(f"mock-llm: {exc}", file=sys.stderr)
        return 2
    print(f"mock-llm listening on {base_url}", flush=True)
    serve_until_stopped(llm.stop)
    return 0


def serve_until_stopped(stop) -> None:
    """Block until SIGTERM or Ctrl-C, then call stop(): the mock servers' command lines."""
    stopping = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        while not stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        stop()
