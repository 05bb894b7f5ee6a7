"""Attempts stopped in flight by the attempt policy (hermes.run.waves): a sibling of theirs passed.

The flow's thread names the keys (stop); the prompts run as coroutines on the run's loop, which
cancels the running ones there (their sandboxes go as on any cancellation: the conversation's own
clean-up). One not started yet never starts. Each is then written as a `stopped` line: final, not a
failure, not owed. Prompts that run in other processes (Dask, worker processes) are not reached:
they finish, and their verdict counts like any other.
"""
from __future__ import annotations

import asyncio
import threading


class Stops:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: set[str] = set()
        self._running: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Task]] = {}

    def stop(self, keys: list[str]) -> None:
        """Thread-safe: stop these attempts, running or not yet started."""
        with self._lock:
            self._asked.update(keys)
            running = [self._running[k] for k in keys if k in self._running]
        for loop, task in running:
            loop.call_soon_threadsafe(task.cancel)

    def asked(self, key: str) -> bool:
        with self._lock:
            return key in self._asked

    async def run(self, key: str, coroutine) -> tuple[bool, object]:
        """(stopped, the coroutine's result): run it unless it is to be stopped, until it is."""
        with self._lock:
            if key in self._asked:
                self._asked.discard(key)
                coroutine.close()
                return True, None
            task = asyncio.ensure_future(coroutine)
            self._running[key] = (asyncio.get_running_loop(), task)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:  # the run itself is being cancelled: so is the prompt
            task.cancel()
            raise
        finally:
            with self._lock:
                self._running.pop(key, None)
        if task.cancelled():
            with self._lock:
                if key in self._asked:
                    self._asked.discard(key)
                    return True, None
            raise asyncio.CancelledError()
        return False, task.result()
