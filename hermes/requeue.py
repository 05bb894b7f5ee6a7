"""Prompts that failed for a transient reason go back in the queue, with backoff, within the run.

The model client has already retried each call (the SDK's retries); a prompt that still failed
for a reason that passes (429 or 5xx after those retries, a time-out, a dropped connection, an
engine time-out: hermes.failures) is tried again from the start after a delay, up to
`--prompt_retries` times, before its failure stands. A permanent failure (a 400, an image that
cannot be had, a failed setup) is not tried again. Every attempt is a line of the journal.

The delay holds no worker: the prompt is handed back to the pool by a timer when it is due.
"""
from __future__ import annotations

import contextvars
import logging
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from hermes.entry import HermesBlock, Status
from hermes.failures import classify

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3           # tries after the first, per prompt and invocation
    base_delay: float = 2.0    # seconds before the first retry; doubled for each further one
    max_delay: float = 30.0

    @classmethod
    def for_settings(cls, settings: Any) -> "RetryPolicy":
        """--prompt_retries, within --max_attempts where that is set (attempts of earlier
        invocations are not counted here: the plan already left out prompts that used theirs up)."""
        retries = settings.prompt_retries
        if settings.max_attempts:
            retries = min(retries, settings.max_attempts - 1)
        return cls(retries=retries)

    def delay(self, outcome: HermesBlock, attempt: int) -> float | None:
        """Seconds until the prompt with this outcome is tried again (attempt: 1 for the first
        try), or None."""
        if outcome.status != Status.FAILED or attempt > self.retries:
            return None
        if not classify(outcome.error).transient:
            return None
        # "Equal jitter": prompts that failed together do not come back together.
        top = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        return top / 2 + random.uniform(0, top / 2)


class RequeueingPool(Generic[T]):
    """Runs `attempt(item, n)` for every item on `workers` threads until none is owed.

    `attempt` returns None when the item is finished, else the seconds after which it is tried
    again (as attempt n + 1). Each attempt runs in a copy of the caller's context, so logs and
    progress reach the orchestrator's run (contextvars do not cross threads by themselves).
    The first exception an attempt raises is raised by run() once the others have ended.
    """

    def __init__(self, workers: int, name: str):
        self.workers = max(1, workers)
        self.name = name

    def run(self, items: list[T], attempt: Callable[[T, int], float | None]) -> None:
        context = contextvars.copy_context()
        done = threading.Condition()
        owed = len(items)
        errors: list[BaseException] = []
        timers: list[threading.Timer] = []

        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=self.name) as pool:
            def submit(item: T, n: int) -> None:
                try:
                    pool.submit(context.copy().run, one, item, n)
                except RuntimeError:  # the pool is shutting down after a failed attempt
                    pass

            def one(item: T, n: int) -> None:
                nonlocal owed
                again = None
                try:
                    again = attempt(item, n)
                except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                    errors.append(e)
                if again is not None and not errors:
                    timer = threading.Timer(again, submit, (item, n + 1))
                    timer.daemon = True
                    timers.append(timer)
                    timer.start()
                    return
                with done:
                    owed -= 1
                    done.notify()

            for item in items:
                submit(item, 1)
            with done:
                while owed and not errors:
                    done.wait(timeout=1.0)
            for timer in timers:
                timer.cancel()  # a failed run tries nothing more
        if errors:
            raise errors[0]
