"""When the next batch starts: as soon as the prompts already handed out can no longer keep
--num_workers slots busy, not all at once at the run's start.

A batch is started with its prompts queued for the run's slots; a prompt leaves the queue when
it takes a slot. The run keeps at most `ahead` prompts queued (one window: a slot that frees finds
a prompt waiting, so none sits idle while prompts remain, and one slow prompt holds back no
other batch), so what the process holds grows with --num_workers and the batch size, never with
the dataset's length: a run of a million prompts has a few batches started at any moment.

Thread-safe: the flow's thread hands batches out and waits here; the prompts, on the run's loop,
say when they start, and finished batches wake the waiter too.
"""
from __future__ import annotations

import threading
from typing import Callable


class Admission:
    def __init__(self, ahead: int):
        self.ahead = max(1, ahead)
        self._queued = 0
        self._changed = threading.Condition()

    @property
    def queued(self) -> int:
        """Prompts handed out that have not taken a slot yet."""
        return self._queued

    def wants_more(self) -> bool:
        return self._queued < self.ahead

    def handed_out(self, prompts: int) -> None:
        with self._changed:
            self._queued += prompts

    def started(self) -> None:
        """A prompt took its slot for the first time (a retry of it is not a new prompt)."""
        with self._changed:
            self._queued -= 1
            if self._queued < self.ahead:
                self._changed.notify_all()

    def withdrawn(self, prompts: int) -> None:
        """Prompts handed out that will never start (their batch ended or was skipped)."""
        with self._changed:
            self._queued = max(0, self._queued - prompts)
            self._changed.notify_all()

    def wake(self) -> None:
        """Something else the waiter looks at changed (a batch finished)."""
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, ready: Callable[[], bool], timeout: float = 5.0) -> None:
        """Until `ready()` (checked under the lock every change is announced under, so no
        announcement is missed between a check and the wait), or `timeout` seconds."""
        with self._changed:
            self._changed.wait_for(ready, timeout)
