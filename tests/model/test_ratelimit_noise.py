"""429s at random do not collapse the run; a real cap still slows it down.

An endpoint of the tests' own (not the bundled mock): a threaded HTTP server on loopback that
answers a seeded random share of chat requests 429, whatever their rate, as an aggregator
whose upstream throttles for reasons of its own does, and optionally enforces a requests-a-second
cap of its own (a token bucket, Retry-After only, no x-ratelimit-* headers). The official
client path (hermes.model.client.ModelClient, its aiohttp calls and the run-wide limiter) talks to it.
"""
from __future__ import annotations

import http.server
import json
import logging
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from hermes.model.client import ModelClient
from hermes.model.ratelimit import PROBE_DECREASES
from hermes.settings import AgentSettings

THREADS = 16
ANSWER = json.dumps({
    "id": "chatcmpl-scripted", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "done", "refusal": None}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()


class ScriptedEndpoint:
    """429 to a seeded `share` of requests (with `retry_after_ms`, or no Retry-After when None),
    and beyond `cap` requests a second when given; every other request answered after `latency`."""

    def __init__(self, share: float, retry_after_ms: int | None, cap: float = 0.0, latency: float = 0.01):
        self.share, self.retry_after_ms, self.cap, self.latency = share, retry_after_ms, cap, latency
        self.rng = random.Random(34)
        self.tokens, self.stamp = cap, time.monotonic()
        self.lock = threading.Lock()
        self.counts = {"requests": 0, "ok": 0, "random_429": 0, "capped_429": 0}
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the client's pool expects

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, headers = endpoint.decide()
                if status == 200:
                    time.sleep(endpoint.latency)
                body = ANSWER if status == 200 else b'{"error": {"message": "Rate limit exceeded."}}'
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def decide(self) -> tuple[int, dict[str, str]]:
        with self.lock:
            self.counts["requests"] += 1
            if self.cap:
                now = time.monotonic()
                self.tokens = min(self.cap, self.tokens + (now - self.stamp) * self.cap)
                self.stamp = now
                if self.tokens < 1:
                    self.counts["capped_429"] += 1
                    return 429, {"retry-after-ms": str(max(1, round((1 - self.tokens) / self.cap * 1000)))}
                self.tokens -= 1
            if self.rng.random() < self.share:
                self.counts["random_429"] += 1
                return 429, {} if self.retry_after_ms is None else {"retry-after-ms": str(self.retry_after_ms)}
            self.counts["ok"] += 1
            return 200, {}

    def __enter__(self) -> "ScriptedEndpoint":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def hammer(endpoint: ScriptedEndpoint, calls: int) -> tuple[int, dict]:
    """THREADS threads, each making `calls` calls one after another, as prompts of a run do;
    returns how many failed for good and what the run-wide limiter saw and decided."""
    client = ModelClient(AgentSettings(model="m", base_url=endpoint.base_url, max_retries=12),
                         max_in_flight=THREADS)

    def one(i: int) -> int:
        failed = 0
        for _ in range(calls):
            try:
                client.complete([{"role": "user", "content": f"prompt {i}"}], [])
            except Exception:  # noqa: BLE001 - counted
                failed += 1
        return failed
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            failed = sum(pool.map(one, range(THREADS)))
        return failed, client.limiter.snapshot()
    finally:
        client.close()


@pytest.mark.parametrize("retry_after_ms", [20, None], ids=["retry-after", "no-retry-after"])
def test_random_429s_do_not_slow_the_run_down(retry_after_ms):
    with ScriptedEndpoint(share=0.35, retry_after_ms=retry_after_ms) as endpoint:
        failed, seen = hammer(endpoint, calls=24)
    print(f"endpoint {endpoint.counts}, limiter {seen}")
    assert failed == 0 and endpoint.counts["ok"] == THREADS * 24
    # it tried slowing down, found that the share of 429s stayed where it was, and took that share
    # as the endpoint's own: the run ends where the clean answers had it, all prompts in flight, unpaced
    assert seen["probes_random"] >= 1 and seen["noise_share"] == pytest.approx(0.35, abs=0.15)
    assert seen["window"] == THREADS and seen["pace_per_minute"] is None
    assert seen["tolerated"] > seen["throttled"] / 2
    assert seen["decreases"] <= PROBE_DECREASES * (seen["probes_random"] + seen["probes_capped"] + 1)
    if retry_after_ms is None:  # a 429 that names no wait paused the run only when it opened a decrease
        assert seen["pauses"] <= PROBE_DECREASES * (seen["probes_random"] + seen["probes_capped"] + 1)


def test_a_cap_beneath_random_429s_is_still_found(caplog):
    # 60 requests a second allowed, and 20% of all requests throttled at random on top
    caplog.set_level(logging.INFO, logger="hermes.model.ratelimit")
    with ScriptedEndpoint(share=0.2, retry_after_ms=20, cap=60.0) as endpoint:
        failed, seen = hammer(endpoint, calls=25)
    print(f"endpoint {endpoint.counts}, limiter {seen}")
    assert failed == 0 and endpoint.counts["ok"] == THREADS * 25
    # slowing down lowered the share of 429s at least once: a cap, which the run is then paced under.
    # (The pace at the end is a point on the climb back towards the cap after the last probe, and
    # under load that climb reaches further: the pace each cap verdict set is what is judged.)
    assert seen["probes_capped"] >= 1 and seen["pace_per_minute"] is not None
    found = [float(m.group(1)) for r in caplog.records
             if (m := re.search(r"a rate limit; the run goes on at \d+ request\(s\) in flight and (\d+) a minute",
                                r.getMessage()))]
    print(f"paces the cap verdicts set, a minute: {found}")
    assert found and all(pace <= 60 * 60 * 1.5 for pace in found), found
    # the cap's own 429s stay a minor part of what the run sent (an unpaced run's would be most of it)
    assert endpoint.counts["capped_429"] < endpoint.counts["requests"] * 0.25
