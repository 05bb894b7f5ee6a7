"""Run-wide admission of model requests: the whole run slows down when the endpoint pushes back.

Every model request of a run (each attempt, retries included) passes one AdaptiveLimiter,
so a rate limit is felt once for the run instead of by each prompt thread on its own:

* window: requests in flight, at most the ceiling (--num_workers). Additive increase (about
  one more per round trip of clean answers), multiplicative decrease on a 429 (once per round
  trip: the answers to requests sent before a decrease do not decrease it again, as in TCP,
  or one burst of 429s would collapse it to one). This is what meets a cap on concurrency.
* pause: after a 429 (or a 503) no request starts before its Retry-After (`retry-after-ms`,
  `Retry-After` seconds or date) has passed: the client's own retry of that request sleeps as
  long, and every other thread now waits with it instead of hitting the limit again.
* pace: starts are spaced in time, which is what meets a cap on requests a minute (a window
  of one still sends hundreds a second to an endpoint that answers in milliseconds). Where
  answers carry OpenAI's `x-ratelimit-limit-requests` (requests a minute) the pace is set a
  little under it from the first answer on, so the run stays below the cap rather than
  finding it by 429s. Otherwise the first throttled round trip sets it just under the rate
  of clean answers of the last second. Each throttled round trip lowers it by a tenth, and
  PACE_RECOVERY clean answers win that back (additive increase).

Without throttling the window stays at the ceiling, which the run's prompt limiter already
enforces, so an endpoint that never says 429 costs one uncontended lock per request.
"""
from __future__ import annotations

import asyncio
import collections
import email.utils
import logging
import threading
import time
from typing import Any, Mapping

log = logging.getLogger(__name__)

DECREASE = 0.8          # window factor on a throttled round trip
PACE_SHARE = 0.97       # share of the advertised requests-a-minute that starts are paced to
PACE_DECREASE = 0.9     # pace factor on a throttled round trip
PACE_RECOVERY = 30      # clean answers that win back a decrease (additive increase)
MEASURE = 1.0           # seconds of clean answers the first pace is measured over
DEFAULT_PAUSE = 1.0     # seconds a 429 without Retry-After pauses the run
MAX_PAUSE = 60.0        # a longer Retry-After is not trusted for the whole run
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
        self.pace_cap: float | None = None  # from x-ratelimit-limit-requests, when sent
        self.pace_step = 0.0            # additive increase of the pace per clean answer
        self.next_start = 0.0
        self._answered: collections.deque[float] = collections.deque()  # times of recent clean answers
        self.epoch = 0                  # bumped by each decrease
        self.counts = {"requests": 0, "throttled": 0, "decreases": 0}
        self._clock = clock
        self._cond = threading.Condition()
        #: coroutines waiting in acquire_async: (their loop, the future that wakes them)
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = collections.deque()
        self._logged = 0.0

    def acquire(self) -> int:
        """Wait for a place; returns the epoch to hand back to release()."""
        with self._cond:
            while True:
                taken, wait = self._take()
                if taken:
                    return self.epoch
                # a full window is woken by release(); a pause or pace by its own time-out
                self._cond.wait(timeout=wait or None)

    async def acquire_async(self) -> int:
        """acquire() for a coroutine: the lock is only held to look, never while waiting, so an
        event loop carrying many requests goes on with the others while this one waits."""
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                taken, wait = self._take()
                if taken:
                    return self.epoch
                waiter = (loop, loop.create_future())
                self._waiters.append(waiter)
            try:
                await asyncio.wait((waiter[1],), timeout=wait or None)
            except asyncio.CancelledError:
                with self._cond:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
                    else:
                        self._wake()  # it was woken and will not take the place: pass the wake-up on
                raise
            with self._cond:
                if waiter in self._waiters:  # its time-out (a pause or pace) ended the wait
                    self._waiters.remove(waiter)

    def _take(self) -> tuple[bool, float]:
        """Under the lock: take a place now (True), or say how long to wait (0: until a release)."""
        now = self._clock()
        wait = max(self.resume_at - now, self.next_start - now if self.pace else 0.0)
        if wait > 0 or self.in_flight >= int(self.window):
            return False, max(wait, 0.0)
        self.in_flight += 1
        self.counts["requests"] += 1
        if self.pace:
            self.next_start = max(now, self.next_start) + 1.0 / self.pace
        if self.in_flight < int(self.window) and self.resume_at <= now and not self.pace:
            self._wake()  # room for more: pass the wake-up on
        return True, 0.0

    def _wake(self) -> None:
        """Wake one waiting thread and one waiting coroutine (each looks again: a spare wake-up costs a look)."""
        self._cond.notify()
        if self._waiters:
            loop, future = self._waiters.popleft()
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # its loop is closed: nobody waits there any more
                pass

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
                self._answered.append(now)
                while self._answered[0] < now - MEASURE:
                    self._answered.popleft()
                self._learn_pace(headers)
            self._wake()

    def _throttled(self, epoch: int, status: int, headers: Mapping[str, str], now: float) -> None:
        pause = retry_after(headers)
        if pause is None and status == 503:
            return  # an overloaded server that names no wait: the retry's backoff is enough
        pause = min(MAX_PAUSE, pause if pause is not None and pause > 0 else DEFAULT_PAUSE)
        self.resume_at = max(self.resume_at, now + pause)
        self.counts["throttled"] += 1
        if epoch == self.epoch:
            self.epoch += 1
            self.counts["decreases"] += 1
            self.window = max(1.0, self.window * DECREASE)
            # Pace below what got through: a request-rate cap is not found by the window alone
            # (an endpoint that answers in milliseconds takes hundreds a second from one thread).
            # No clean answer yet (a first burst, all in flight): a sub-second Retry-After is the time
            # to the cap's next token, so about one over the cap's rate; else the next round trip sets it.
            measured = len(self._answered) / MEASURE or (1.0 / pause if pause < 1.0 else 0.0)
            if self.pace or measured:
                self.pace = max(1.0 / MAX_PAUSE, PACE_DECREASE * (self.pace or measured))
                self.pace_step = (1 - PACE_DECREASE) * self.pace / PACE_RECOVERY
            if now - self._logged >= LOG_EVERY:
                self._logged = now
                log.warning("the model endpoint throttles (%d): the run slows to %d request(s) in flight%s, "
                            "pausing %.2fs", status, int(self.window),
                            f" and {self.pace * 60:.0f} a minute" if self.pace else "", pause)

    def _learn_pace(self, headers: Mapping[str, str]) -> None:
        limit = _int(headers, "x-ratelimit-limit-requests")
        if limit and limit > 0:
            self.pace_cap = limit / 60.0 * PACE_SHARE
            if self.pace is None:
                self.pace, self.pace_step = self.pace_cap, self.pace_cap / PACE_RECOVERY / 10
        if self.pace is not None:
            self.pace += self.pace_step
            if self.pace_cap:
                self.pace = min(self.pace, self.pace_cap)

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            return {**self.counts, "window": int(self.window), "in_flight": self.in_flight,
                    "pace_per_minute": round(self.pace * 60, 1) if self.pace else None}


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
