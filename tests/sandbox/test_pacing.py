"""The pacing controller (hermes/sandbox/pacing.py) against simulated engines on a virtual clock.

A simulated engine has a knee: up to `knee` calls in flight each takes `base` seconds; past it
they share the engine (latency grows with the number in flight) and contend (`contention`: the
whole engine gets slower, as dockerd does), and a call slower than `timeout` comes back as a
time-out. Callers are a closed loop (each asks again as soon as its call is back), as a run's
prompts are. The controller is judged as a user would judge it: sandboxes a second against the
best fixed setting found by sweeping the same engine, and never more in flight than the ceiling.
The real engines' figures are bench/engine_pacing.py's (bench/REPORT.md).
"""
from __future__ import annotations

import heapq
import random
import threading
from dataclasses import dataclass
from typing import Callable

import pytest

from hermes.sandbox.base import EngineTimeout
from hermes.sandbox.pacing import Controller, Pacer


@dataclass
class Engine:
    knee: int
    base: float = 0.05
    contention: float = 0.02
    timeout: float = 30.0
    noise: float = 0.15

    def latency(self, n: int, rng: random.Random) -> float:
        over = max(0, n - self.knee)
        return (self.base * max(1.0, n / self.knee) * (1 + self.contention * over)
                * rng.lognormvariate(0, self.noise))


@dataclass
class Outcome:
    rate: float          # calls finished a second, over the whole run
    late_rate: float     # over its second half
    peak: int            # most calls in flight at once
    controller: Controller | None


def simulate(engine: Engine | Callable[[float], Engine], *, calls: int = 3000, demand: int = 64,
             fixed: int | None = None, ceiling: int = 64, seed: int = 1) -> Outcome:
    """Run `calls` engine calls through the controller (or a fixed gate of `fixed`)."""
    rng = random.Random(seed)
    engine_at = engine if callable(engine) else (lambda now: engine)
    ctl = None if fixed else Controller(ceiling, now=0.0)
    now, in_flight, peak, done, half_t = 0.0, 0, 0, 0, None
    pending: list[tuple[float, int, bool]] = []
    seq = 0

    def fill() -> None:
        nonlocal in_flight, peak, seq
        while in_flight < (fixed or ctl.limit) and in_flight < demand:
            in_flight += 1
            peak = max(peak, in_flight)
            e = engine_at(now)
            took = e.latency(in_flight, rng)
            if ctl:
                ctl.admitted(now)
            seq += 1
            heapq.heappush(pending, (now + min(took, e.timeout), seq, took > e.timeout))

    fill()
    while done < calls:
        now, _, overloaded = heapq.heappop(pending)
        in_flight -= 1
        done += 1
        if ctl:
            ctl.finished(now, overloaded)
        if done == calls // 2:
            half_t = now
        fill()
    return Outcome(done / now, (calls - calls // 2) / (now - half_t), peak, ctl)


def best_fixed(engine, **kw) -> float:
    return max(simulate(engine, fixed=n, **kw).late_rate for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
               if n <= kw.get("ceiling", 64))


@pytest.mark.parametrize("knee,contention", [(2, 0.05), (6, 0.02), (6, 0.2), (20, 0.01), (40, 0.0)])
def test_converges_near_the_knee_of_the_engine(knee, contention):
    engine = Engine(knee, contention=contention)
    best = best_fixed(engine)
    for seed in (1, 2, 3):
        got = simulate(engine, seed=seed)
        # What a user sees: nearly the best fixed setting's sandboxes a second, without knowing it.
        assert got.rate >= 0.85 * best, (seed, got.rate, best, got.controller.history)
        assert got.late_rate >= 0.9 * best, (seed, got.late_rate, best, got.controller.history)
        assert knee / 2 <= got.controller.accepted <= 3 * knee + 2, got.controller.history


def test_bad_fixed_settings_are_what_the_controller_avoids():
    """The simulated engines are the kind the controller is for: 1 and 64 both lose much."""
    engine = Engine(6, contention=0.2)
    best = best_fixed(engine)
    assert simulate(engine, fixed=1).rate < 0.3 * best
    assert simulate(engine, fixed=64).rate < 0.3 * best
    assert simulate(engine).rate > 0.85 * best


def test_backs_off_when_the_engine_is_overloaded():
    """An engine whose knee falls from 16 to 3 (another tenant arrives): the limit comes down
    and the run gets nearly what the best fixed setting would get from the slower engine."""
    fast, slow = Engine(16, contention=0.1), Engine(3, contention=0.3)
    got = simulate(lambda now: fast if now < 10 else slow, calls=6000)
    ctl = got.controller
    assert max(limit for _, limit in ctl.history) >= 12, ctl.history  # it had found the fast knee
    assert ctl.accepted <= 8, ctl.history
    assert got.late_rate >= 0.85 * best_fixed(slow, calls=3000), (got.late_rate, ctl.history)


def test_timeouts_halve_the_limit_once_per_round():
    ctl = Controller(64, now=0.0)
    ctl.limit = ctl.accepted = 16
    ctl.slow = False
    for _ in range(16):
        ctl.admitted(0.0)
    ctl.finished(1.0, overloaded=True)
    assert ctl.limit == 8
    for _ in range(10):  # the rest of that round saw the same overload: no further halving
        ctl.finished(1.1, overloaded=True)
    for _ in range(5):
        ctl.finished(1.2)
    assert ctl.limit == 8
    for _ in range(8):
        ctl.admitted(2.0)
    ctl.finished(3.0, overloaded=True)  # a new round still timing out
    assert ctl.limit == 4


def test_an_engine_that_times_out_past_its_knee_is_held_below_it():
    engine = Engine(8, base=0.1, contention=0.5, timeout=1.0)
    got = simulate(engine, calls=4000)
    assert got.controller.overloads > 0  # it did find the edge ...
    assert got.late_rate >= 0.8 * best_fixed(engine, calls=4000)  # ... and stays on the right side of it
    assert got.controller.accepted <= 12


def test_the_limit_never_exceeds_the_ceiling():
    engine = Engine(100, contention=0.0)
    got = simulate(engine, ceiling=10)
    assert got.peak <= 10
    assert got.controller.accepted == 10
    assert got.late_rate >= 0.85 * simulate(engine, fixed=10).late_rate  # its probes below cost a little
    assert max(limit for _, limit in got.controller.history) <= 10


def test_callers_that_do_not_fill_the_limit_do_not_grow_it():
    got = simulate(Engine(50, contention=0.0), demand=3)
    assert got.controller.limit <= 4, got.controller.history


def test_the_pacer_gate_bounds_real_threads_and_fails_a_wait_past_its_time():
    pacer = Pacer(3, adaptive=False, name="test engine")
    lock, state, release = threading.Lock(), {"now": 0, "peak": 0}, threading.Event()

    def call():
        with pacer.slot("a call", 10):
            with lock:
                state["now"] += 1
                state["peak"] = max(state["peak"], state["now"])
            release.wait(10)
            with lock:
                state["now"] -= 1

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    while pacer.busy < 3:
        threading.Event().wait(0.01)
    with pytest.raises(EngineTimeout, match="test engine too slow"):
        with pacer.slot("one more", 0.05):
            pass
    release.set()
    for t in threads:
        t.join(10)
    assert state["peak"] == 3 and pacer.busy == 0
