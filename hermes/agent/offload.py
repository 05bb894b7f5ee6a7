"""Blocking work of a run's prompt coroutines, on a pool of threads beside their event loop.

A batch run's prompts are coroutines on the model client's loop (hermes.run.runner): what would
block that loop (a tool call, a sandbox's making and removal, a row's setup and check, the
journal's fsync) is awaited through an Offload instead. Each call runs in a copy of the
awaiting coroutine's context, so its logs still reach the prompt's run.

The pool is elastic. It starts with a few threads (CORE_THREADS), made with the pool: a thread
made from the loop while prompts wait on it held up every prompt's model calls. A thread in a
call for GROW_AFTER seconds or more (a command that runs for minutes) is held up: once calls
have waited GROW_AFTER with fewer than CORE_THREADS threads free, each of them gets a thread of
its own, up to one per prompt in flight (plus a few for journal lines). So a long command never
makes another prompt's tool call wait for it much longer than GROW_AFTER, while a burst of
short calls is cleared by the threads there. Threads beyond the first few
leave once idle for IDLE_SECONDS. Why not a thread per prompt in flight from the start: at
512 prompts in flight their short calls (a file written, `cat` run) then ran on 512 threads at
once, and handing the interpreter lock among them cost more than the calls (context switches,
bench/THROUGHPUT.md, session 8).
"""
from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import threading
import time
from concurrent.futures import Executor, Future
from typing import Any, Callable, TypeVar

T = TypeVar("T")

#: threads beyond one per prompt in flight: journal lines and sandbox removals of prompts that
#: already gave their slot back
SPARE_THREADS = 16
#: threads a pool starts with and keeps: at 512 prompts in flight on two cores, 4 to 16 did the
#: same work, 32 about 5% slower and 64 15% (bench/THROUGHPUT.md, session 8)
CORE_THREADS = 16
#: how long a call may run before its thread counts as held up, and wait before it gets a thread;
#: under a burst of hundreds of prompts' short calls some took over 0.1 s (waiting for the lock),
#: and at 0.1 s the pool grew to hundreds of threads again
GROW_AFTER = 0.5
#: a thread beyond the core leaves after this long without a call
IDLE_SECONDS = 30.0


class ElasticPool(Executor):
    """A thread pool that grows only when calls wait (see the module's docstring)."""

    def __init__(self, most: int, *, core: int = CORE_THREADS, grow_after: float = GROW_AFTER,
                 idle_seconds: float = IDLE_SECONDS, name: str = "prompt-io"):
        self.most, self.core = most, min(core, most)
        self.grow_after, self.idle_seconds, self.name = grow_after, idle_seconds, name
        self._cv = threading.Condition()
        self._queue: collections.deque[tuple[float, Future, Callable[[], Any]]] = collections.deque()
        self._threads = self._idle = self._made = 0
        self._calls: dict[int, float] = {}  # thread id -> when its current call began
        self._closed = False
        self._starving = threading.Event()  # calls wait and no thread is idle: the grower looks
        with self._cv:
            for _ in range(self.core):
                self._start()
        threading.Thread(target=self._grow, name=f"{name}-grower", daemon=True).start()

    @property
    def threads(self) -> int:
        return self._threads

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> "Future[T]":
        future: Future = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after the pool was closed")
            self._queue.append((time.monotonic(), future, functools.partial(fn, *args, **kwargs)))
            if self._idle >= len(self._queue):
                self._cv.notify()
            else:
                self._starving.set()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cv:
            self._closed = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft()[1].cancel()
            self._cv.notify_all()
        self._starving.set()
        if wait:
            with self._cv:
                self._cv.wait_for(lambda: self._threads == 0)

    def _start(self) -> None:  # under self._cv
        self._threads += 1
        self._idle += 1  # born idle: it looks at the queue before it waits
        self._made += 1
        # Daemons: a command stuck past its prompt's end must not hold the process's exit; the
        # run awaits every call it made before it ends.
        threading.Thread(target=self._work, name=f"{self.name}_{self._made}", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._cv:
                idle_since = time.monotonic()
                while not self._queue and not self._closed:
                    if not self._cv.wait(self.idle_seconds) and not self._queue and self._threads > self.core \
                            and time.monotonic() - idle_since >= self.idle_seconds:
                        self._leave()
                        return
                if not self._queue:  # closed, and nothing is left to do
                    self._leave()
                    return
                _, future, call = self._queue.popleft()
                self._idle -= 1
                self._calls[threading.get_ident()] = time.monotonic()
            if future.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as e:
                    future.set_exception(e)
                else:
                    future.set_result(result)
            del future, call
            with self._cv:
                self._idle += 1
                del self._calls[threading.get_ident()]

    def _leave(self) -> None:  # under self._cv
        self._idle -= 1
        self._threads -= 1
        self._cv.notify_all()  # shutdown(wait=True) waits for the last one

    def _grow(self) -> None:
        """While calls wait for want of a thread. A thread in a call for grow_after s or more is
        held up (a command that runs for minutes); once the head of the queue has waited
        grow_after s with fewer than `core` threads free of such calls, every call that has
        waited that long gets a thread of its own. Threads busy with short calls keep the queue
        moving, however long it is: under a burst of hundreds of prompts' calls, a thread each
        cost more in hand-overs of the interpreter lock than the calls did."""
        while True:
            self._starving.wait()
            with self._cv:
                if self._closed:
                    return
                if not self._queue or self._idle >= len(self._queue) or self._threads >= self.most:
                    self._starving.clear()  # nothing waits for want of a thread, or none may be added
                    continue
                now = time.monotonic()
                if now - self._queue[0][0] >= self.grow_after:
                    held_up = sum(1 for began in self._calls.values() if now - began >= self.grow_after)
                    free = self._threads - held_up
                    if free < self.core:
                        overdue = 0
                        for queued_at, _, _ in self._queue:  # oldest first
                            if now - queued_at < self.grow_after:
                                break
                            overdue += 1
                        for _ in range(min(max(self.core - free, overdue - self._idle), self.most - self._threads)):
                            self._start()
            time.sleep(self.grow_after / 5)


class Offload:
    def __init__(self, prompts_in_flight: int, name: str = "prompt-io", **pool: Any):
        self.pool = ElasticPool(prompts_in_flight + SPARE_THREADS, name=name, **pool)

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a thread of the pool; its result (or exception) here."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self.pool, call)

    def close(self) -> None:
        """No new calls; those under way finish on their own (a run's end has awaited them all)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
