"""Prompts that failed for a transient reason go back in the queue, with backoff, within the run.

The model client has already retried each call (the SDK's retries); a prompt that still failed
for a reason that passes (429 or 5xx after those retries, a time-out, a dropped connection, an
engine time-out: hermes.data.failures) is tried again from the start after a delay, up to
`--prompt_retries` times, before its failure stands. A permanent failure (a 400, an image that
cannot be had, a failed setup) is not tried again. Every attempt is a line of the journal.

The delay holds no slot: the prompt's coroutine sleeps, then takes a slot again for its next try.
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

from hermes.data.entry import HermesBlock, Status
from hermes.data.failures import classify

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
        # what the failure said it was (hermes.errors), else what its text says (hermes.data.failures)
        if not classify(outcome.error, outcome.error_kind, outcome.error_transient).transient:
            return None
        # "Equal jitter": prompts that failed together do not come back together.
        top = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        return top / 2 + random.uniform(0, top / 2)


async def requeueing(items: list[T], attempt: Callable[[T, int], Awaitable[float | None]]) -> None:
    """Await `attempt(item, n)` for every item, all at once (the attempt takes the run's slot for
    its prompt itself), until none is owed.

    `attempt` returns None when the item is finished, else the seconds after which it is tried
    again (as attempt n + 1); the wait holds no slot. The first exception an attempt raises is
    raised here once the others have ended, and no item starts an attempt after it.
    """
    errors: list[BaseException] = []

    async def one(item: T) -> None:
        n = 1
        while not errors:
            try:
                again = await attempt(item, n)
            except BaseException as e:  # noqa: BLE001 - raised once the others have ended
                errors.append(e)
                return
            if again is None:
                return
            await asyncio.sleep(again)
            n += 1

    await asyncio.gather(*(one(item) for item in items))
    if errors:
        raise errors[0]
