"""Chat completion requests of a run, all sent from one event loop over one aiohttp pool.

Why not the SDK's own async client here: at hundreds of requests in flight its per-call work
(request and URL models, header merging, copies of the options, the httpx layers over the
transport) cost about 0.65 ms of interpreter time a call against 0.25 ms for the same POST
through aiohttp alone, and the interpreter lock is what bounds a run with many prompts in flight
(bench/THROUGHPUT.md, workload 4). What the SDK's call gave is kept, the same way:

* retries: 408, 409, 429 and 5xx answers, dropped connections and time-outs, up to
  `max_retries` times; `x-should-retry` overrides; an answer asking to wait more than two
  minutes is not retried; the wait is the answer's Retry-After when there is one, else 0.5 s
  doubled each retry up to 8 s, less up to a quarter of jitter (openai-python's
  `_should_retry` and `_calculate_retry_timeout`);
* errors: the messages the SDK's typed errors carried, as ModelError;
* every attempt passes the run's AdaptiveLimiter, which sees each answer's status and headers.

Streams (`ModelClient.complete_stream`) stay on the SDK: its stream state assembles them.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import json
import random
import threading
import weakref
from typing import Any, Callable, Coroutine, Mapping, TypeVar

import aiohttp
import orjson

from hermes.data.failures import status_failure
from hermes.errors import HermesError
from hermes.model.breaker import OPEN, Breaker
from hermes.model.context import CONTEXT_LENGTH, context_exceeded
from hermes.model.ratelimit import AdaptiveLimiter, retry_after

INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 8.0
MAX_RETRY_AFTER = 120.0
#: the kind of a request that got no answer in its time (--request_timeout)
TIMED_OUT = "model endpoint time-out"
T = TypeVar("T")


class CallError(HermesError):
    """A request failed for good; str() is what ModelError says."""


def should_retry(status: int, headers: Mapping[str, str]) -> bool:
    asked = retry_after(headers)
    if asked is not None and asked > MAX_RETRY_AFTER:
        return False
    told = headers.get("x-should-retry")
    if told in ("true", "false"):
        return told == "true"
    return status in (408, 409, 429) or status >= 500


def retry_wait(retries_done: int, headers: Mapping[str, str] | None) -> float:
    asked = retry_after(headers) if headers is not None else None
    if asked is not None and 0 < asked <= MAX_RETRY_AFTER:
        return asked
    return min(INITIAL_RETRY_DELAY * 2.0 ** retries_done, MAX_RETRY_DELAY) * (1 - 0.25 * random.random())


def status_text(status: int, raw: bytes) -> str:
    """What the endpoint said: its error's message, else "Error code: N" as the SDK says."""
    try:
        body = json.loads(raw)
    except ValueError:
        return f"Error code: {status}"
    err = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str) and err["message"]:
        return err["message"]
    return f"Error code: {status}"


def encode(body: dict[str, Any]) -> bytes:
    """A request's JSON: orjson's, about five times the standard library's speed on a long
    conversation (each call sends the whole of it again), the standard one for what orjson
    refuses (integers past 64 bits)."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body).encode()


class Endpoint:
    """POSTs to one chat completions URL, on the loop that made it."""

    def __init__(self, base_url: str, api_key: str, *, limiter: AdaptiveLimiter, max_retries: int,
                 timeout: float, breaker: Breaker | None = None):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
                        "Accept": "application/json"}
        self.limiter, self.max_retries = limiter, max_retries
        self.breaker = breaker or Breaker(float("inf"))  # sees every attempt (hermes.model.breaker)
        # as httpx's Timeout(t) that the SDK was given: each connect and each read, not the total
        self.seconds = timeout
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        # the limiter bounds what is in flight; every connection is kept for its next request
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=5.0),
                                             timeout=self.timeout)

    async def post(self, body: dict[str, Any]) -> Any:
        data = encode(body)
        breaker = self.breaker
        for retries_done in range(self.max_retries + 1):
            last = retries_done == self.max_retries
            if breaker.open:  # the endpoint is down: no more attempts, the run is ending
                raise CallError(f"model endpoint down: {breaker.reason}", kind=OPEN, transient=True)
            epoch = await self.limiter.acquire_async()
            try:
                async with self.session.post(self.url, data=data, headers=self.headers) as resp:
                    raw = await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                self.limiter.release(epoch, None)
                timed_out = isinstance(e, asyncio.TimeoutError)
                breaker.failed(TIMED_OUT if timed_out else "model endpoint connection failed",
                               f"no answer within --request_timeout {self.seconds:g} s" if timed_out else
                               f"cannot connect ({e or type(e).__name__})")
                if last:
                    raise CallError("model endpoint failed: " + ("Request timed out." if timed_out else
                                                                 "Connection error."), transient=True,
                                    kind=TIMED_OUT if timed_out else "model endpoint connection failed") from e
                await asyncio.sleep(retry_wait(retries_done, None))
                continue
            except BaseException:
                self.limiter.release(epoch, None)
                raise
            self.limiter.release(epoch, resp.status, resp.headers)
            if resp.status < 400:
                breaker.alive()
                try:
                    return orjson.loads(raw)
                except ValueError as e:
                    raise CallError(f"model endpoint answered something that is not JSON: {e}",
                                    kind="model endpoint non-JSON answer", transient=True) from e
            failure = status_failure(resp.status)
            said = f"model endpoint answered {resp.status}: {status_text(resp.status, raw)}"
            breaker.failed(failure.kind, said)
            if context_exceeded(resp.status, raw):
                raise CallError(said, kind=CONTEXT_LENGTH, transient=False)
            if last or not should_retry(resp.status, resp.headers):
                raise CallError(said, kind=failure.kind, transient=failure.transient)
            await asyncio.sleep(retry_wait(retries_done, resp.headers))
        raise AssertionError("unreachable")

    async def close(self) -> None:
        await self.session.close()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's where it installs: its socket reads and writes happen in C without letting go of
    the interpreter lock, where asyncio's each let go of it and queue to take it back behind
    every busy prompt thread; at 512 prompts in flight a call's time on the loop fell from
    about 1.45 s to 1.15 s for 1 s of the server's latency (bench/THROUGHPUT.md, workload 4)."""
    try:
        import uvloop
    except ImportError:  # Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class CallLoop:
    """An event loop on a daemon thread of its own, with an Endpoint made on it.

    A client that is never closed (a test, a script) ends it when collected: the loop's thread
    holds no reference to this object, whose finalizer closes the pool and the loop.
    """

    def __init__(self, make_endpoint: Callable[[], Endpoint]):
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="model-calls", daemon=True)
        self.thread.start()

        async def make() -> Endpoint:  # on the loop: the pool belongs to it
            return make_endpoint()
        self.endpoint = asyncio.run_coroutine_threadsafe(make(), self.loop).result()
        self._finalizer = weakref.finalize(self, _shut_down, self.loop, self.thread, self.endpoint)

    def post(self, body: dict[str, Any]) -> Any:
        """endpoint.post(body) on the loop; its result (or exception) here, when it is done."""
        try:
            future = asyncio.run_coroutine_threadsafe(self.endpoint.post(body), self.loop)
        except RuntimeError as e:  # the loop is closed
            raise CallError("the model client is closed") from e
        try:
            return future.result()
        except concurrent.futures.CancelledError as e:
            raise CallError("the model client was closed while the call was out") from e
        except BaseException:
            future.cancel()  # an interrupted caller takes its request back
            raise

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> "concurrent.futures.Future[T]":
        """Start `coroutine` on the loop, in a copy of the caller's context (what it logs belongs
        to the caller's run: contextvars do not cross threads by themselves); its future here."""
        context = contextvars.copy_context()

        async def in_context() -> T:
            return await asyncio.get_running_loop().create_task(coroutine, context=context)
        try:
            return asyncio.run_coroutine_threadsafe(in_context(), self.loop)
        except RuntimeError as e:  # the loop is closed
            coroutine.close()
            raise CallError("the model client is closed") from e

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """submit(coroutine)'s result, waited for here; an interrupted caller cancels it."""
        future = self.submit(coroutine)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        self._finalizer()


def _shut_down(loop: asyncio.AbstractEventLoop, thread: threading.Thread, endpoint: Endpoint) -> None:
    async def closing() -> None:
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        try:
            await endpoint.close()
        finally:
            loop.stop()

    if loop.is_closed():
        return
    asyncio.run_coroutine_threadsafe(closing(), loop)
    if threading.current_thread() is thread:  # collected on the loop itself: it stops once this returns
        return
    thread.join(timeout=30)
    if not thread.is_alive():
        loop.close()
