"""ModelClient's calls of many threads on one event loop: each thread gets its own answer, the
limiter sees every request, close() ends the loop's thread; AdaptiveLimiter's asyncio side.

The official openai SDK against the bundled model server on loopback.
"""
from __future__ import annotations

import asyncio
import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from hermes.model.client import ModelClient, ModelError
from hermes.model.ratelimit import AdaptiveLimiter
from hermes.settings import AgentSettings
from hermes.tools import openai_schemas, tools_for
from mockllm import MockLLM
from tests.helpers import until

THREADS = 48


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "model-calls"]


def test_many_threads_on_one_client_each_get_their_own_answer():
    tools = openai_schemas(tools_for(["file"]))
    before = set(loop_threads())
    with MockLLM(latency=0.2) as server:
        client = ModelClient(AgentSettings(model="m", base_url=server.base_url), max_in_flight=THREADS)

        def one(i: int) -> dict:
            return client.complete([{"role": "user", "content": f"task number {i}"}], tools).message

        with ThreadPoolExecutor(THREADS) as pool:
            answers = list(pool.map(one, range(THREADS)))
        seen = client.limiter.snapshot()
        sent = httpx.get(server.url + "/_mock/requests").json()
        assert len(set(loop_threads()) - before) == 1  # one loop carries them all
        client.close()
    sent = sent["requests"] if isinstance(sent, dict) else sent
    # the server was asked once per thread, each with that thread's conversation ...
    assert sorted(b["messages"][0]["content"] for b in sent) == sorted(f"task number {i}" for i in range(THREADS))
    # ... and each thread got the answer to its own: the scripted server quotes the task back
    for i, message in enumerate(answers):
        assert f"task number {i}'" in message["reasoning"], message
        assert message["tool_calls"][0]["function"]["name"] == "write_file"
    assert seen["requests"] == THREADS and seen["in_flight"] == 0
    assert not set(loop_threads()) - before


def test_close_ends_the_loop_thread_and_later_calls_fail_plainly():
    with MockLLM() as server:
        others = set(loop_threads())  # clients of earlier tests in this process may still be collected
        client = ModelClient(AgentSettings(model="m", base_url=server.base_url))
        assert client.complete([{"role": "user", "content": "hi"}], []).message["content"]
        (thread,) = set(loop_threads()) - others
        client.close()
        assert not thread.is_alive()
        with pytest.raises(ModelError, match="closed"):
            client.complete([{"role": "user", "content": "hi"}], [])
        client.close()  # twice is fine


def test_a_client_never_closed_ends_its_loop_when_collected():
    with MockLLM() as server:
        others = set(loop_threads())
        client = ModelClient(AgentSettings(model="m", base_url=server.base_url))
        client.complete([{"role": "user", "content": "hi"}], [])
        (thread,) = set(loop_threads()) - others
        del client
        gc.collect()
        thread.join(timeout=30)
        assert not thread.is_alive()


def test_errors_cross_from_the_loop_with_their_messages():
    with MockLLM(error_rate=1.0, error_status=400) as server:
        client = ModelClient(AgentSettings(model="m", base_url=server.base_url), max_retries=0)
        with pytest.raises(ModelError, match="model endpoint answered 400"):
            client.complete([{"role": "user", "content": "hi"}], [])
        assert client.limiter.snapshot()["in_flight"] == 0
        client.close()


async def coroutines_waiting(limiter: AdaptiveLimiter, n: int, timeout: float = 30) -> None:
    """Let the loop run until n coroutines wait in the limiter (a bound against hanging, not a timing)."""
    deadline = time.monotonic() + timeout
    while len(limiter._waiters) < n:
        assert time.monotonic() < deadline, f"gave up waiting for {n} coroutine(s) in acquire_async"
        await asyncio.sleep(0.001)


def test_a_coroutine_waits_for_a_place_while_the_loop_goes_on():
    limiter = AdaptiveLimiter(2)

    async def main() -> None:
        first = await limiter.acquire_async()
        await limiter.acquire_async()
        third = asyncio.ensure_future(limiter.acquire_async())
        await coroutines_waiting(limiter, 1)  # the loop ran this coroutine while the third waits
        assert not third.done() and limiter.in_flight == 2
        # released from another thread (a sync caller of the same limiter): the coroutine is woken
        releaser = threading.Thread(target=limiter.release, args=(first, 200))
        releaser.start()
        await asyncio.wait_for(third, 30)
        releaser.join()
        assert limiter.in_flight == 2 and limiter.counts["requests"] == 3

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_its_place_to_the_next():
    limiter = AdaptiveLimiter(1)

    async def main() -> None:
        held = await limiter.acquire_async()
        gone = asyncio.ensure_future(limiter.acquire_async())
        stays = asyncio.ensure_future(limiter.acquire_async())
        await coroutines_waiting(limiter, 2)
        gone.cancel()
        limiter.release(held, 200)
        await asyncio.wait_for(stays, 30)
        assert gone.cancelled() and limiter.in_flight == 1

    asyncio.run(main())


def test_a_sync_waiter_is_woken_by_a_release_on_the_loop():
    limiter = AdaptiveLimiter(1)
    got: list[int] = []

    async def main() -> None:
        held = await limiter.acquire_async()
        waiter = threading.Thread(target=lambda: got.append(limiter.acquire()))
        waiter.start()
        # the thread is in the limiter's wait (threading.Condition keeps its waiting threads in _waiters)
        await asyncio.to_thread(until, lambda: limiter._cond._waiters, "the thread waiting for a place", 30, 0.005)
        assert not got
        limiter.release(held, 200)
        await asyncio.to_thread(waiter.join, 30)

    asyncio.run(main())
    assert got == [0] and limiter.in_flight == 1


def test_the_offload_pool_gives_a_call_stuck_behind_long_ones_a_thread_and_short_ones_share():
    # A batch's blocking calls: a command that runs long must not make another prompt's call wait
    # for it, and a burst of short calls must not make a thread each (the lock's hand-over among
    # hundreds of threads cost more than the calls).
    import contextvars

    from hermes.agent.offload import ElasticPool, Offload

    pool = ElasticPool(24, core=2, grow_after=0.5, idle_seconds=0.5, name="elastic-io")
    try:
        assert pool.threads == 2  # made with the pool, not from the loop by a call
        shorts = [pool.submit(time.sleep, 0.001) for _ in range(40)]
        for f in shorts:
            f.result(timeout=30)
        assert pool.threads == 2  # cleared by the two threads there: no thread per short call
        release = threading.Event()
        long_calls = [pool.submit(release.wait, 30) for _ in range(2)]
        assert pool.submit(lambda: "short").result(timeout=5) == "short"  # not after the long ones
        stuck = [pool.submit(release.wait, 30) for _ in range(30)]
        until(lambda: pool.threads == 24, "a thread for each call that waited, up to the most", 10)
        time.sleep(0.3)
        assert pool.threads == 24 and sum(f.running() for f in long_calls + stuck) == 24  # the rest wait
        release.set()
        for f in long_calls + stuck:
            assert f.result(timeout=10) is True
        until(lambda: pool.threads == 2, "threads beyond the core leave once idle", 10)
    finally:
        pool.shutdown(wait=True)
    assert pool.threads == 0

    offload = Offload(4, core=2)
    who = contextvars.ContextVar("who")

    async def calls() -> list[str]:
        who.set("prompt 3")
        return await asyncio.gather(*(offload(lambda: who.get()) for _ in range(20)))
    try:
        assert asyncio.run(calls()) == ["prompt 3"] * 20  # each call in the awaiting coroutine's context
    finally:
        offload.close()
