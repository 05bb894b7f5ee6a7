"""The mock's requests-per-minute cap, enforced as providers enforce theirs.

A token bucket: ``rpm`` tokens a minute, refilled continuously, holding at most ``burst``
(providers quantize a per-minute limit over shorter periods, so a 600 RPM tier does not take
600 requests in its first second; the default burst is one second's worth). A request that
finds no token is answered 429 at once, with ``Retry-After``/``retry-after-ms`` (time until the
next token) and a message that carries that time, as OpenAI's does ("Please try again in
820ms."). Every answer carries OpenAI's ``x-ratelimit-*-requests`` headers, measured when the
request arrived: limit (the RPM), remaining (whole tokens left) and reset (time until full).
"""
from __future__ import annotations

import math
import threading
import time


def format_duration(seconds: float) -> str:
    """OpenAI's style: ``820ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.0f}s" if minutes else f"{rest:.3g}s"


class RequestBucket:
    def __init__(self, rpm: float, burst: int = 0):
        self.rpm = rpm
        self.rate = rpm / 60.0
        self.capacity = float(burst or max(1, math.ceil(self.rate)))
        self.tokens = self.capacity
        self.stamp = time.monotonic()
        self._lock = threading.Lock()

    def take(self) -> tuple[bool, float, dict[str, str]]:
        """(allowed, seconds until the next token, headers for the answer)."""
        with self._lock:
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            allowed = self.tokens >= 1
            if allowed:
                self.tokens -= 1
            wait = 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate
            headers = {
                "x-ratelimit-limit-requests": str(int(self.rpm)),
                "x-ratelimit-remaining-requests": str(int(self.tokens)),
                "x-ratelimit-reset-requests": format_duration((self.capacity - self.tokens) / self.rate),
            }
        return allowed, wait, headers
