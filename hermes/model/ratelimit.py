"""Run-wide admission of model requests: the whole run slows down when the endpoint pushes back.

Every model request of a run (each attempt, retries included) passes one AdaptiveLimiter,
so a rate limit is felt once for the run instead of by each prompt thread on its own:

* window: requests in flight, at most the ceiling (--num_workers). Additive increase (about
  one more per round trip of clean answers), multiplicative decrease on a 429 (once per round
  trip: the answers to requests sent before a decrease do not decrease it again, as in TCP,
  or one burst of 429s would collapse it to one). This is what meets a cap on concurrency.
* pause: after a 429 (or a 503) no request starts before its Retry-After (`retry-after-ms`,
  `Retry-After` seconds or date) has passed: the client's own retry of that request sleeps as
  long, and every other thread now waits with it instead of hitting the limit again. A 429
  that names no wait pauses the run DEFAULT_PAUSE only when it decreases the window (once a
  round trip); while a probe (below) measures, a Retry-After of a second or more pauses the
  run only when its 429 decreases; a 429 tolerated as random pauses nobody but its own retry.
* pace: starts are spaced in time, which is what meets a cap on requests a minute (a window
  of one still sends hundreds a second to an endpoint that answers in milliseconds). Where
  answers carry OpenAI's `x-ratelimit-limit-requests` (requests a minute) the pace is set a
  little under it from the first answer on, so the run stays below the cap rather than
  finding it by 429s. Otherwise the first throttled round trip sets it just under the rate
  of clean answers of the last second. Each throttled round trip lowers it by a tenth, and
  PACE_RECOVERY clean answers win that back (additive increase).
* probe: a 429 is no proof that the run is too fast (an aggregator's upstream answers 429 at
  random, whatever our rate, and loss-based AIMD collapses under random loss: TCP's old
  problem). So the decreases above are an experiment, judged by what they achieve: the first
  throttled round trip opens a probe; its lower level (at most PROBE_DECREASES decreases) is
  held for PROBE_ANSWERS answers, then the level the 429s came at is restored for as many
  more. A share of 429s clearly higher up there (Z_CAP standard errors) is a cap: the run
  goes back down to the lower level. A share that slowing down did not lower is random: the
  run stays up, and the share down low is tolerated from then on (no decrease, no run-wide
  pause: the retry of the request itself still waits its Retry-After) until the share of the
  last SAMPLE answers rises clearly above it (Z_NOISE standard errors): the next probe.
  So the window and the pace do not settle below what the clean answers sustained.

Without throttling the window stays at the ceiling, which the run's prompt limiter already
enforces, so an endpoint that never says 429 costs one uncontended lock per request.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import email.utils
import logging
import math
import threading
import time
from typing import Any, Mapping

log = logging.getLogger(__name__)

DECREASE = 0.8          # window factor on a throttled round trip
PACE_SHARE = 0.97       # share of the advertised requests-a-minute that starts are paced to
PACE_DECREASE = 0.9     # pace factor on a throttled round trip
PACE_RECOVERY = 30      # clean answers that win back a decrease (additive increase)
MEASURE = 1.0           # seconds of clean answers the first pace is measured over
MIN_MEASURED = 8        # fewer clean answers than this (or half the window) in it is no measure
DEFAULT_PAUSE = 1.0     # seconds a 429 without Retry-After pauses the run
MAX_PAUSE = 60.0        # a longer Retry-After is not trusted for the whole run
LOG_EVERY = 10.0        # seconds between "the endpoint throttles" log lines
PROBE_ANSWERS = 80      # answers measured at each level of a probe (a 15-point difference is 2 SEs)
PROBE_DECREASES = 3     # most decreases within a probe: how far down one experiment goes
SAMPLE = 128            # recent answers whose share of 429s is compared with the tolerated one
Z_CAP = 2.0             # standard errors by which the share up high must exceed the share down low
Z_NOISE = 3.0           # standard errors by which the recent share must exceed the tolerated one
MIN_NOISE = 0.02        # least share the tolerance's standard error is figured from
MAX_NOISE = 0.9         # a share this high at both levels is not tolerated: nothing gets through


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


@dataclasses.dataclass
class _Level:
    window: float
    pace: float | None
    pace_step: float


@dataclasses.dataclass
class _Probe:
    """An experiment: does slowing down lower the share of 429s? Answers are told apart by epoch."""
    upper: _Level                   # where the run was when the 429s came
    low_epoch: int                  # requests of this epoch on were sent at the lower level
    high_epoch: int | None = None   # ... and of this one on back at the upper level
    lower: _Level | None = None     # the lower level as it was when its measure ended
    decreases: int = 0
    low: list[int] = dataclasses.field(default_factory=lambda: [0, 0])   # answers, of them 429
    high: list[int] = dataclasses.field(default_factory=lambda: [0, 0])


def differs(low: list[int], high: list[int]) -> bool:
    """Is the share of 429s up high clearly (Z_CAP standard errors) above the share down low?"""
    (nl, tl), (nh, th) = low, high
    pooled = (tl + th) / (nl + nh)
    if pooled >= MAX_NOISE:
        return True  # all but nothing throttled at both levels: keep slowing down and pausing
    se = math.sqrt(pooled * (1 - pooled) * (1 / nl + 1 / nh))
    return th / nh - tl / nl > Z_CAP * se > 0


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
        self.epoch = 0                  # bumped by each decrease (and a probe's return to its upper level)
        self.counts = {"requests": 0, "throttled": 0, "decreases": 0, "pauses": 0, "tolerated": 0,
                       "probes_capped": 0, "probes_random": 0}
        self.noise: float | None = None  # share of 429s that slowing down did not lower
        self._probe: _Probe | None = None
        self._recent: collections.deque[bool] = collections.deque(maxlen=SAMPLE)  # throttled?, per answer
        self._recent_throttled = 0
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
                self._outcome(epoch, False)
            self._wake()

    def _throttled(self, epoch: int, status: int, headers: Mapping[str, str], now: float) -> None:
        asked = retry_after(headers)
        if asked is None and status == 503:
            return  # an overloaded server that names no wait: the retry's backoff is enough
        self.counts["throttled"] += 1
        self._outcome(epoch, True)
        if self._tolerated():
            self.counts["tolerated"] += 1
            return
        probe = self._probe
        news = epoch == self.epoch and (probe is None or (probe.high_epoch is None
                                                          and probe.decreases < PROBE_DECREASES))
        # Within a probe the 429s that do not decrease pause the run only for a sub-second Retry-After
        # (a cap's time to its next token, short by nature): at random 429s a pause on each (Retry-After
        # 1 s at 35%) would hold the whole run still while the probe is measured. Without a Retry-After,
        # too, only the round trip's first 429 pauses the run, not each of them.
        if not news and (asked is None or asked <= 0 or (probe is not None and asked >= 1.0)):
            return
        pause = min(MAX_PAUSE, asked if asked is not None and asked > 0 else DEFAULT_PAUSE)
        if pause > 0:
            self.counts["pauses"] += 1
            self.resume_at = max(self.resume_at, now + pause)
        if news:
            self._decrease(status, pause, now)

    def _decrease(self, status: int, pause: float, now: float) -> None:
        if self._probe is None:
            self._probe = _Probe(upper=self._level(), low_epoch=self.epoch + 1)
        self._probe.decreases += 1
        self.epoch += 1
        self.counts["decreases"] += 1
        self.window = max(1.0, self.window * DECREASE)
        # Pace below what got through: a request-rate cap is not found by the window alone
        # (an endpoint that answers in milliseconds takes hundreds a second from one thread).
        # No clean answer yet (a first burst, all in flight): a sub-second Retry-After is the time
        # to the cap's next token, so about one over the cap's rate; else the next round trip sets it.
        # A handful of clean answers is the front of a round trip's answers, not a rate (at 2 s a call
        # the first 429 comes with the first few answers of the first wave): no pace from that.
        answered = len(self._answered) if len(self._answered) >= min(MIN_MEASURED, self.window / 2) else 0
        measured = answered / MEASURE or (1.0 / pause if 0 < pause < 1.0 else 0.0)
        if self.pace or measured:
            self.pace = max(1.0 / MAX_PAUSE, PACE_DECREASE * (self.pace or measured))
            self.pace_step = (1 - PACE_DECREASE) * self.pace / PACE_RECOVERY
        if now - self._logged >= LOG_EVERY:
            self._logged = now
            log.warning("the model endpoint throttles (%d): the run slows to %d request(s) in flight%s, "
                        "pausing %.2fs", status, int(self.window),
                        f" and {self.pace * 60:.0f} a minute" if self.pace else "", pause)

    def _tolerated(self) -> bool:
        """A 429 at the share that slowing down did not lower: random, not news of our rate."""
        if self.noise is None or self._probe is not None:
            return False
        n = len(self._recent)
        q = max(self.noise, MIN_NOISE)
        return self._recent_throttled / n <= self.noise + Z_NOISE * math.sqrt(q * (1 - q) / n)

    def _outcome(self, epoch: int, throttled: bool) -> None:
        """Count an answer (clean or throttled) in the recent share and in the open probe, if any."""
        if len(self._recent) == SAMPLE:
            self._recent_throttled -= self._recent[0]
        self._recent.append(throttled)
        self._recent_throttled += throttled
        probe = self._probe
        if probe is None or epoch < probe.low_epoch:
            return
        arm = probe.high if probe.high_epoch is not None and epoch >= probe.high_epoch else probe.low
        arm[0] += 1
        arm[1] += throttled
        if probe.high_epoch is None and probe.low[0] >= PROBE_ANSWERS:
            # the lower level is measured: back up to where the 429s came, and measure there
            probe.lower = self._level()
            self._set_level(probe.upper)
            self.epoch += 1
            probe.high_epoch = self.epoch
        elif probe.high_epoch is not None and probe.high[0] >= PROBE_ANSWERS:
            self._judge(probe)

    def _judge(self, probe: _Probe) -> None:
        self._probe = None
        (nl, tl), (nh, th) = probe.low, probe.high
        if differs(probe.low, probe.high):
            # a cap: slowing down lowered the share of 429s, so down the run goes again
            self.counts["probes_capped"] += 1
            self.noise = None
            self._set_level(probe.lower)
            self.epoch += 1
            log.info("slowing down lowered the share of 429s (%.0f%% against %.0f%%): a rate limit; the run "
                     "goes on at %d request(s) in flight%s", 100 * tl / nl, 100 * th / nh, int(self.window),
                     f" and {self.pace * 60:.0f} a minute" if self.pace else "")
        else:
            self.counts["probes_random"] += 1
            # the share down low, not the pooled one: a cap's 429s up high would raise what is tolerated
            # probe by probe until the cap's own 429s passed for random
            self.noise = tl / nl
            log.warning("slowing down did not lower the share of 429s (%.0f%% against %.0f%%): the endpoint "
                        "throttles at random; the run stays at %d request(s) in flight%s and rides out about "
                        "%.0f%% of 429s without slowing down", 100 * tl / nl, 100 * th / nh, int(self.window),
                        f" and {self.pace * 60:.0f} a minute" if self.pace else "", 100 * self.noise)

    def _level(self) -> _Level:
        return _Level(self.window, self.pace, self.pace_step)

    def _set_level(self, level: _Level) -> None:
        self.window, self.pace_step = level.window, level.pace_step
        # an advertised cap learnt since holds: a level from before it (unpaced) is paced to it
        self.pace = min(level.pace or self.pace_cap, self.pace_cap) if self.pace_cap else level.pace

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
                    "pace_per_minute": round(self.pace * 60, 1) if self.pace else None,
                    "noise_share": None if self.noise is None else round(self.noise, 3)}


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
