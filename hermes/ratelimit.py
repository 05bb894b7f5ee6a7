"""Run-wide admission of model requests: the whole run slows down when the endpoint pushes back.

Every model request of a run (each SDK attempt, retries included) passes one AdaptiveLimiter,
so a rate limit is felt once for the run instead of by each prompt thread on its own:

* window: requests in flight, at most the ceiling (--num_workers). Additive increase (about
  one more per round trip of clean answers), multiplicative decrease on a 429 (halved; once
  per round trip: the answers to requests sent before a decrease do not decrease it again, as
  in TCP, or one burst of 429s would collapse it to one).
* pause: after a 429 (or a 503) no request starts before its Retry-After (`retry-after-ms`,
  `Retry-After` seconds or date) has passed: the SDK's own retry of that request sleeps as
  long, and every other thread now waits with it instead of hitting the limit again.
* pace: where answers carry OpenAI's `x-ratelimit-limit-requests` (requests a minute), starts
  are spaced to that rate, a little under it, so a run stays below the cap rather than
  finding it by 429s; a 429 all the same lowers the pace by a tenth, clean answers bring it
  back up by a hundredth of the cap each.

Without throttling the window stays at the ceiling, which the run's prompt limiter already
enforces, so an endpoint that never says 429 costs one uncontended lock per request.
"""
from __future__ import annotations

import email.utils
import logging
import threading
import time
from typing import Any, Mapping

import openai

log = logging.getLogger(__name__)

DECREASE = 0.5          # window factor on a throttled round trip
PACE_SHARE = 0.97       # share of the advertised requests-a-minute that starts are paced to
PACE_DECREASE = 0.9     # pace factor on a 429 while pacing
DEFAULT_PAUSE = 1.0     # seconds a 429 without Retry-After pauses the run
MAX_PAUSE = 60.0        # a longer Retry-After is not trusted (the SDK caps its own the same way)
LOG_EVERY = 10.0        # seconds between "the endpoint throttles" log lines


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds an answer asks to wait: `retry-after-ms`, or `Retry-After` (seconds or an HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return float(ms) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        when = email.utils.parsedate_tz(value)
        return None if when is None else email.utils.mktime_tz(when) - time.time()


def _int(headers: Mapping[str, str], name: str) -> int | None:
    try:
        return int(float(headers[name]))
    except (KeyError, ValueError):
        return None


class AdaptiveLimiter:
    def __init__(self, ceiling: int, clock=time.monotonic):
        self.ceiling = max(1, ceiling)
        self.window = float(self.ceiling)
        self.in_flight = 0
        self.resume_at = 0.0            # no request starts before this
        self.pace: float | None = None  # requests a second starts are spaced to (None: not paced)
        self.next_start = 0.0
        self.epoch = 0                  # bumped by each decrease
        self.counts = {"requests": 0, "throttled": 0, "decreases": 0}
        self._clock = clock
        self._cond = threading.Condition()
        self._logged = 0.0

    def acquire(self) -> int:
        """Wait for a place; returns the epoch to hand back to release()."""
        with self._cond:
            while True:
                now = self._clock()
                wait = max(self.resume_at - now, self.next_start - now if self.pace else 0.0)
                if wait <= 0 and self.in_flight < int(self.window):
                    break
                # a full window is woken by release(); a pause or pace by its own time-out
                self._cond.wait(timeout=wait if wait > 0 else None)
            self.in_flight += 1
            self.counts["requests"] += 1
            if self.pace:
                self.next_start = max(now, self.next_start) + 1.0 / self.pace
            if self.in_flight < int(self.window) and self.resume_at <= now and not self.pace:
                self._cond.notify()  # room for more: pass the wake-up on
            return self.epoch

    def release(self, epoch: int, status: int | None, headers: Mapping[str, str] | None = None) -> None:
        """A request ended: `status` of its answer, None when it got none (time-out, dropped connection)."""
        headers = headers or {}
        with self._cond:
            self.in_flight -= 1
            now = self._clock()
            if status in (429, 503):
                self._throttled(epoch, status, headers, now)
            elif status is not None and status < 400:
                self.window = min(float(self.ceiling), self.window + 1.0 / self.window)
                self._learn_pace(headers)
            self._cond.notify()

    def _throttled(self, epoch: int, status: int, headers: Mapping[str, str], now: float) -> None:
        pause = retry_after(headers)
        if pause is None and status == 503:
            return  # an overloaded server that names no wait: the SDK's backoff is enough
        pause = min(MAX_PAUSE, pause if pause is not None and pause > 0 else DEFAULT_PAUSE)
        self.resume_at = max(self.resume_at, now + pause)
        self.counts["throttled"] += 1
        if epoch == self.epoch:
            self.epoch += 1
            self.counts["decreases"] += 1
            self.window = max(1.0, self.window * DECREASE)
            if self.pace:
                self.pace *= PACE_DECREASE
            if now - self._logged >= LOG_EVERY:
                self._logged = now
                log.warning("the model endpoint throttles (%d): the run slows to %d request(s) in flight%s, "
                            "pausing %.2fs", status, int(self.window),
                            f" and {self.pace * 60:.0f} a minute" if self.pace else "", pause)

    def _learn_pace(self, headers: Mapping[str, str]) -> None:
        limit = _int(headers, "x-ratelimit-limit-requests")
        if not limit or limit <= 0:
            return
        cap = limit / 60.0 * PACE_SHARE
        self.pace = cap if self.pace is None else min(cap, self.pace + cap / 100)

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            return {**self.counts, "window": int(self.window), "in_flight": self.in_flight,
                    "pace_per_minute": round(self.pace * 60, 1) if self.pace else None}


class LimitedHttpClient(openai.DefaultHttpxClient):
    """The SDK's own HTTP client (its defaults), with every request it sends admitted by `limiter`.

    `send` is where each attempt of the SDK's retry loop goes out, so the limiter sees every
    attempt and its answer; the SDK's backoff sleeps happen outside it, holding no place.
    """

    def __init__(self, limiter: AdaptiveLimiter, **kwargs: Any):
        super().__init__(**kwargs)
        self.limiter = limiter

    def send(self, request, **kwargs):  # type: ignore[override]
        epoch = self.limiter.acquire()
        try:
            response = super().send(request, **kwargs)
        except BaseException:
            self.limiter.release(epoch, None)
            raise
        # A streamed answer is released at its headers: a rate limit counts requests as they start.
        self.limiter.release(epoch, response.status_code, response.headers)
        return response
