"""Blocking work of a run's prompt coroutines, on a pool of threads beside their event loop.

A batch run's prompts are coroutines on the model client's loop (hermes.runner): what would
block that loop (a tool call, a sandbox's making and removal, a row's setup and check, the
journal's fsync) is awaited through an Offload instead. Each call runs in a copy of the
awaiting coroutine's context, so its logs still reach the prompt's run.

The pool holds at most one thread per prompt in flight (plus a few for journal lines and
removals): a command that runs for minutes holds its thread, and must never make another
prompt's tool call wait for it. Threads are made as calls need them and reused when idle.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")

#: threads beyond one per prompt in flight: journal lines and sandbox removals of prompts that
#: already gave their slot back
SPARE_THREADS = 16


class Offload:
    def __init__(self, prompts_in_flight: int, name: str = "prompt-io"):
        self.pool = ThreadPoolExecutor(max_workers=prompts_in_flight + SPARE_THREADS, thread_name_prefix=name)

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a thread of the pool; its result (or exception) here."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self.pool, call)

    def close(self) -> None:
        """No new calls; those under way finish on their own (a run's end has awaited them all)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
