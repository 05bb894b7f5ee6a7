"""Blocking work of a run's prompt coroutines, on a pool of threads beside their event loop.

A batch run's prompts are coroutines on the model client's loop (hermes.runner): what would
block that loop (a tool call, a sandbox's making and removal, a row's setup and check, the
journal's fsync) is awaited through an Offload instead. Each call runs in a copy of the
awaiting coroutine's context, so its logs still reach the prompt's run.

The pool holds at most one thread per prompt in flight (plus a few for journal lines and
removals): a command that runs for minutes holds its thread, and must never make another
prompt's tool call wait for it. The threads are started with the pool (`start`), not as
calls first need them: a thread's start waits for the new thread to run, and made from the
loop while hundreds of prompts took their first tool turn together, those waits held up every
prompt's model calls (7% of the loop's samples at 512 prompts in flight, bench/THROUGHPUT.md).
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")

#: threads beyond one per prompt in flight: journal lines and sandbox removals of prompts that
#: already gave their slot back
SPARE_THREADS = 16


class Offload:
    def __init__(self, prompts_in_flight: int, name: str = "prompt-io"):
        self.size = prompts_in_flight + SPARE_THREADS
        self.pool = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix=name)

    def start(self, timeout: float = 60.0) -> "Offload":
        """Start every thread of the pool now (from a thread that is not the prompts' loop).

        The pool makes a thread for each call that finds none idle, so calls that all wait at one
        barrier until every one of them runs leave the pool with all its threads, idle."""
        gate = threading.Barrier(self.size + 1, timeout=timeout)

        def arrive() -> None:
            try:
                gate.wait()
            except threading.BrokenBarrierError:
                pass  # a thread that did not come in time: the pool still makes it when a call needs it
        for _ in range(self.size):
            self.pool.submit(arrive)
        arrive()
        return self

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a thread of the pool; its result (or exception) here."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self.pool, call)

    def close(self) -> None:
        """No new calls; those under way finish on their own (a run's end has awaited them all)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
