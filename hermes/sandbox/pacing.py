"""Sandbox starts paced to the engine: how many creates, starts and removes may be in flight at
once, found from the engine's own answers rather than fixed (issue #49).

Engines differ tenfold in how many starts they take at once (runc on an idle host, dockerd,
Podman, a loaded node), and each has a knee: below it more in flight means more sandboxes a
second; past it only longer queues inside the engine (dockerd: ~0.5 s a sandbox at 4 in flight,
~8 s at 64 for the same throughput, and a deadlock once at 64). A fixed number is wrong for all
but one engine, so:

- Controller (pure: no thread, no clock of its own; a virtual-clock engine drives it in
  tests/sandbox/test_pacing.py) measures throughput (calls finished per second) over epochs of a
  few dozen calls and climbs it: doubling while each doubling still buys throughput, then probing
  one step up and one step down around the accepted limit. A step up is kept only if throughput
  rose by 8%; a step down only if throughput did not fall and calls took less (the same
  sandboxes a second with less queued: latency that had climbed without throughput comes back
  down; below the knee a step down leaves calls' time as it was, so noise in throughput alone
  cannot walk the limit down). Probes thin out while the limit holds; a large fall while holding
  (the engine loaded from elsewhere) probes at once. A time-out or an engine error (5xx) halves
  the limit at once.
- Epochs where callers did not fill the limit say nothing about the engine and change nothing
  (a run with 3 prompts in flight never grows the limit).
- The user's --sandbox_engine_concurrency is the ceiling; --sandbox_engine_pacing fixed keeps the
  old fixed gate at that number.
- Pacer is the thread-safe gate around one engine's calls with a Controller inside; pacer(key)
  gives the process-wide one of an engine (docker's, runc's), as the old gate was process-wide.

Why throughput first and not latency alone (TCP Vegas, Netflix's gradient limiters): on this
2-core host a sandbox's start shares the CPU with everything else the run does, so latency rises
with any load, not only the engine's queue; a Vegas-style controller here (base latency from
medians, Little's-law step-down) sat below the knee and reached 0.73x the best fixed setting on
runc. What callers care about is sandboxes a second, so that is what is climbed; latency only
confirms a step down.
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from hermes.sandbox.base import EngineTimeout


@dataclass(frozen=True)
class PacingParams:
    """The controller's tuning (measured on docker and runc here: bench/engine_pacing.py)."""

    start: int = 4              # the first limit: few engines take less (1 and 2 lose little at 4)
    min_samples: int = 20       # calls finished per epoch at least ...
    slow_samples: int = 8       # ... while doubling (a doubling's gain is large: fewer suffice)
    samples_per_slot: float = 2.0  # ... and this many per unit of limit (at least two rounds)
    gain: float = 0.08          # a rise in throughput smaller than this is noise, not a gain
    loss: float = 0.0           # a step down is kept if throughput did not fall (noise must not walk it down)
    latency_share: float = 0.5  # a step down is kept if calls took this share of the time Little's law
                                # says a plateau would save (step / limit), at least
    slow_gain: float = 0.10     # a doubling must buy at least this much to double again
    drop: float = 0.25          # a fall this large while holding: the engine changed, back off
    drop_probes_down: bool = True   # after a drop: probe down first (else up first, as always)
    max_streak: int = 1         # a step doubles with each move the same way, this many times at most
    hold_max: int = 16          # epochs between probes, at most, while the limit holds
    saturated: float = 0.85     # mean in flight / limit above which an epoch says something


class Controller:
    """The limit, moved by what the engine's calls took. Call admitted() as a call goes in and
    finished() as it comes back, both with the time now; read `limit`."""

    def __init__(self, ceiling: int, params: PacingParams | None = None, now: float = 0.0):
        self.p = params or PacingParams()
        self.ceiling = max(1, int(ceiling))
        self.limit = max(1, min(self.ceiling, self.p.start))
        self.accepted = self.limit       # the limit probes return to
        self.ref: float | None = None   # throughput at `accepted`, calls a second
        self.ref_latency = 0.0          # and the mean time a call took there, seconds
        self.slow = True                # doubling phase, until a doubling buys nothing
        self.probe: str | None = None   # "up" / "down" while an epoch measures a probe
        self.hold = 1                   # epochs to hold before the next probe
        self.held = 0
        self.streak = 0                 # probes in a row that moved the limit the same way
        self.in_flight = 0
        self.overloads = 0              # time-outs and engine errors seen (for reports)
        self.history: list[tuple[float, int]] = [(now, self.limit)]
        self._settle = 0                # calls admitted under an old limit, still to finish
        self._reset_epoch(now)

    # -- events -------------------------------------------------------------

    def set_ceiling(self, ceiling: int, now: float) -> None:
        ceiling = max(1, int(ceiling))
        if ceiling != self.ceiling:
            self.ceiling = ceiling
            if self.limit > ceiling or self.accepted > ceiling:
                self.accepted = min(self.accepted, ceiling)
                self._set(min(self.limit, ceiling), now)

    def admitted(self, now: float) -> None:
        self._advance(now)
        self.in_flight += 1

    def finished(self, now: float, overloaded: bool = False) -> None:
        """One call came back; `overloaded`: it timed out or the engine answered 5xx."""
        self._advance(now)
        self.in_flight = max(0, self.in_flight - 1)
        if overloaded:
            self.overloads += 1
            if self._settle == 0:  # once per round: the others in flight saw the same overload
                self._overloaded(now)
            else:
                self._settle -= 1
            return
        if self._settle > 0:  # admitted under an older limit: not this limit's measure
            self._settle -= 1
            if self._settle == 0:
                self._reset_epoch(now)
            return
        self.count += 1
        need = (max(self.p.slow_samples, self.limit) if self.slow
                else max(self.p.min_samples, self.p.samples_per_slot * self.limit))
        if self.count >= need and now > self.t0:
            mean_in_flight = self.area / (now - self.t0)
            x = self.count / (now - self.t0)
            # Little's law: the mean time a call took, from the mean in flight and the throughput
            self._decide(now, x, mean_in_flight / self.limit, mean_in_flight / x)

    # -- the policy ---------------------------------------------------------

    def _decide(self, now: float, x: float, busy: float, latency: float) -> None:
        p = self.p
        if busy < p.saturated:
            # Callers did not fill the limit: nothing learnt about the engine. A probe's limit
            # goes back (it was never tried); the reference is stale for the next full epoch.
            self.ref, self.probe = None, None
            self._set(self.accepted, now)
            return
        if self.ref is None:
            self.ref, self.ref_latency = x, latency
        elif self.slow:
            if x >= self.ref * (1 + p.slow_gain):
                self.accepted, self.ref, self.ref_latency = self.limit, x, latency
            else:
                self.slow = False
                self._set(self.accepted, now)  # the doubling bought nothing: back to the last good one
                return
        elif self.probe == "up":
            if x > self.ref * (1 + p.gain):
                self.accepted, self.ref, self.ref_latency = self.limit, x, latency
                self.hold, self.streak = 1, self.streak + 1
                self._probe("up", now)  # a gain: further up at once, in growing steps
            else:
                self.streak = 0
                self._probe("down", now)
            return
        elif self.probe == "down":
            # NB: with the gate full, Little's law makes the latency test nearly the throughput
            # test again (latency = in flight / throughput); measured with it, kept until a
            # quiet machine can tell whether requiring two epochs in a row does better.
            shorter = 1 - p.latency_share * (self.accepted - self.limit) / self.accepted
            if x >= self.ref * (1 - p.loss) and latency <= self.ref_latency * shorter:
                # Same throughput for less in flight, and calls that took less (below the knee a
                # step down leaves their time as it was: throughput alone, in noise, would let
                # chance walk the limit down): keep it, and go on down in growing steps. The
                # reference stays the higher one, so steps down never drift below what the
                # engine gave.
                self.accepted, self.hold, self.streak = self.limit, 1, self.streak + 1
                self._probe("down", now)
            else:
                self.probe, self.hold, self.held, self.streak = None, min(p.hold_max, self.hold * 2), 0, 0
                self._set(self.accepted, now)
            return
        elif x < self.ref * (1 - p.drop):
            # Holding, and the engine gives much less than it did: it is loaded from elsewhere
            # (another tenant, a slower phase). The old reference says nothing any more: take
            # what it gives now, and probe soon (up, then down) against that.
            self.ref, self.ref_latency, self.hold, self.streak = x, latency, 1, 0
            if p.drop_probes_down:
                self._probe("down", now)
                return
            self.held = self.hold
        else:
            self.ref = 0.5 * self.ref + 0.5 * x  # holding: follow the engine as it drifts
            self.ref_latency = 0.5 * self.ref_latency + 0.5 * latency
            self.held += 1
        if self.slow:
            if self.limit >= self.ceiling:
                self.slow = False
            else:
                self._set(min(self.ceiling, self.limit * 2), now)
                return
        if self.probe is None and self.held >= self.hold:
            self.held = 0
            self._probe("up", now)
            return
        self._reset_epoch(now)

    def _step(self) -> int:
        return max(1, self.accepted // 4) << min(self.streak, self.p.max_streak)

    def _probe(self, direction: str, now: float) -> None:
        if direction == "up" and self.accepted < self.ceiling:
            self.probe = "up"
            self._set(min(self.ceiling, self.accepted + self._step()), now)
        elif self.accepted > 1:
            self.probe = "down"
            self._set(max(1, self.accepted - self._step()), now)
        else:  # nowhere to probe: hold longer
            self.probe, self.hold = None, min(self.p.hold_max, self.hold * 2)
            self._set(self.accepted, now)

    def _overloaded(self, now: float) -> None:
        self.accepted = max(1, min(self.limit, self.accepted) // 2)
        self.slow, self.probe, self.ref, self.hold, self.held, self.streak = False, None, None, 1, 0, 0
        self._set(self.accepted, now)

    # -- bookkeeping --------------------------------------------------------

    def _set(self, limit: int, now: float) -> None:
        if limit != self.limit:
            self.limit = limit
            self.history.append((now, limit))
        self._settle = self.in_flight  # those finish before this limit is measured
        self._reset_epoch(now)

    def _reset_epoch(self, now: float) -> None:
        self.t0, self.last, self.count, self.area = now, now, 0, 0.0

    def _advance(self, now: float) -> None:
        if now > self.last:
            self.area += min(self.in_flight, self.limit) * (now - self.last)
            self.last = now


def is_overload(exc: BaseException | None) -> bool:
    """An answer that says the engine is past its knee: a time-out, or a 5xx from it."""
    if exc is None:
        return False
    if isinstance(exc, (EngineTimeout, TimeoutError)):
        return True
    status = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
    return isinstance(status, int) and status >= 500


class Pacer:
    """A gate of calls to one engine, its width the Controller's limit (or fixed at the ceiling).
    Waiting for a slot is bounded, so a stuck engine fails prompts instead of piling them up."""

    def __init__(self, ceiling: int, adaptive: bool = True, params: PacingParams | None = None,
                 clock: Callable[[], float] = time.monotonic, name: str = "engine", unit: str = "calls"):
        self.name, self.unit = name, unit
        self.adaptive = adaptive
        self.clock = clock
        self.busy = 0
        self._cond = threading.Condition()
        self.controller = Controller(ceiling, params, clock())

    @property
    def limit(self) -> int:
        return self.controller.limit if self.adaptive else self.controller.ceiling

    def configure(self, ceiling: int, adaptive: bool) -> None:
        with self._cond:
            if ceiling != self.controller.ceiling or adaptive != self.adaptive:
                self.adaptive = adaptive
                self.controller.set_ceiling(ceiling, self.clock())
                self._cond.notify_all()

    def reset(self) -> None:
        """Forget what was learnt (a benchmark's fresh start, as a new process would have)."""
        with self._cond:
            self.controller = Controller(self.controller.ceiling, self.controller.p, self.clock())
            self._cond.notify_all()

    @contextlib.contextmanager
    def slot(self, what: str, timeout: float, overload: Callable[[BaseException | None], bool] = is_overload
             ) -> Iterator[None]:
        with self._cond:
            if not self._cond.wait_for(lambda: self.busy < self.limit, timeout):
                raise EngineTimeout(f"{self.name} too slow: {what} waited {timeout:g}s behind "
                                    f"{self.busy} {self.unit} in flight")
            self.busy += 1
            self.controller.admitted(self.clock())
        failed: BaseException | None = None
        try:
            yield
        except BaseException as e:
            failed = e
            raise
        finally:
            with self._cond:
                self.busy -= 1
                before = self.limit
                self.controller.finished(self.clock(), overload(failed))
                if self.limit > before:
                    self._cond.notify_all()
                else:
                    self._cond.notify()


_pacers: dict[str, Pacer] = {}
_pacers_lock = threading.Lock()


def pacer(key: str, ceiling: int, adaptive: bool = True, unit: str = "calls") -> Pacer:
    """The process-wide Pacer of one engine (docker's per engine address, runc's), set to the
    settings' ceiling and mode."""
    with _pacers_lock:
        found = _pacers.get(key)
        if found is None:
            found = _pacers[key] = Pacer(ceiling, adaptive, name=key, unit=unit)
    found.configure(ceiling, adaptive)
    return found
