"""A circuit breaker over a run's model requests: an endpoint that is down stops the run.

Why: an endpoint that dies mid-run (or never served) made every prompt burn its retries, one
by one, each ending Failed for a resume to redo (issue 44: 20 prompts, 6 min 58 s). When every
request has failed for an endpoint-wide reason (no connection, a time-out, 401/403/404, 5xx)
for `seconds` with no success in between, the breaker opens: requests still out stop retrying,
no new prompt starts, the prompts that failed meanwhile are not journaled (they stay owed), and
the run ends with the reason. A working endpoint's passing faults keep today's behaviour: any
success, and any answer that shows the endpoint working (a 429, a 400 about one prompt), closes
the window again.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from hermes.data.outcome import TooManyFailedPrompts
from hermes.errors import HermesError

#: the kind of a request refused because the breaker is open
OPEN = "model endpoint down (breaker open)"
_WIDE = {"model endpoint connection failed", "model endpoint time-out", "model endpoint 401",
         "model endpoint 403", "model endpoint 404"}


def endpoint_wide(kind: str | None) -> bool:
    """Whether a failure of this kind says the endpoint as a whole cannot serve (not one prompt)."""
    if not kind:
        return False
    if kind in _WIDE or kind == OPEN:
        return True
    status = kind.removeprefix("model endpoint ")
    return status.isdigit() and int(status) >= 500


class BreakerOpen(HermesError):
    kind = OPEN
    transient = True


class EndpointDown(TooManyFailedPrompts):
    """The breaker stopped the run; its outputs were written and the prompts not done are owed."""


class Breaker:
    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds, self._clock = seconds, clock
        self._lock = threading.Lock()
        self._since: float | None = None  # first endpoint-wide failure since the last sign of life
        self.reason: str | None = None    # set once the breaker opened: what the requests said

    @property
    def open(self) -> bool:
        return self.reason is not None

    def raise_if_open(self) -> None:
        if self.reason is not None:
            raise BreakerOpen(f"model endpoint down: {self.reason} (no success for {self.seconds:g} s; "
                              f"--breaker_seconds)")

    def alive(self) -> None:
        """The endpoint answered something that shows it working."""
        with self._lock:
            self._since = None

    def failed(self, kind: str | None, text: str) -> None:
        if not endpoint_wide(kind):
            self.alive()
            return
        now = self._clock()
        with self._lock:
            if self._since is None:
                self._since = now
            elif self.reason is None and now - self._since >= self.seconds:
                self.reason = text
