"""A rate-limited endpoint slows the whole run down, not each thread on its own.

The official openai SDK (through hermes.model.client.ModelClient) against the bundled model server
enforcing a requests-per-minute cap on loopback, as a provider's tier does: answered 429 at
once beyond the cap, with Retry-After, with or without x-ratelimit-* headers.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from hermes.model.client import ModelClient
from hermes.model.ratelimit import AdaptiveLimiter, retry_after
from hermes.settings import AgentSettings
from mockllm import MockLLM

THREADS, CALLS = 24, 4


def hammer(complete) -> int:
    """THREADS threads, each making CALLS calls one after another, as prompts of a run do;
    returns how many calls failed for good (their retries used up)."""
    def one(i: int) -> int:
        failed = 0
        for _ in range(CALLS):
            try:
                complete([{"role": "user", "content": f"prompt {i}"}])
            except Exception:  # noqa: BLE001 - counted
                failed += 1
        return failed
    with ThreadPoolExecutor(THREADS) as pool:
        return sum(pool.map(one, range(THREADS)))


@pytest.mark.parametrize("headers", [True, False], ids=["x-ratelimit-headers", "retry-after-only"])
def test_a_rate_limited_endpoint_is_asked_far_less_often_in_vain(headers):
    # 1200 a minute = 20 a second, one second's worth at once; 96 calls take about five seconds
    with MockLLM(rpm=1200, ratelimit_headers=headers) as alone, MockLLM(rpm=1200, ratelimit_headers=headers) as ours:
        sdk = openai.OpenAI(base_url=alone.base_url, api_key="x", max_retries=6)  # each thread for itself
        failed_alone = hammer(lambda m: sdk.chat.completions.create(model="m", messages=m))
        sdk.close()
        client = ModelClient(AgentSettings(model="m", base_url=ours.base_url, max_retries=6),
                             max_in_flight=THREADS)
        failed_ours = hammer(lambda m: client.complete(m, []))
        seen = client.limiter.snapshot()
        client.close()
        by_itself, run_wide = alone.stats(), ours.stats()
    print(f"SDK alone: {by_itself}, {failed_alone} failed; run-wide: {run_wide}, limiter {seen}")
    # with the same retries (the SDK's default 6), every call of ours was answered in the end
    assert failed_ours == 0 and run_wide["ok"] == THREADS * CALLS
    assert by_itself["ok"] + failed_alone == THREADS * CALLS
    # the run-wide limiter saw the 429s it caused, slowed down, and caused far fewer of them
    assert seen["throttled"] == run_wide["rate_limited"]
    assert run_wide["rate_limited"] * 2 < by_itself["rate_limited"], (run_wide, by_itself)
    if headers:  # paced to the advertised cap from the first answer on
        assert seen["pace_per_minute"] == pytest.approx(1200 * 0.97, rel=0.05)
    else:  # nothing to go by but the 429s: it found the cap by them, and slowed down
        assert seen["pace_per_minute"] is not None and seen["decreases"] >= 1


def test_a_burst_of_429s_slows_the_run_once_per_round_trip():
    now = [100.0]
    limiter = AdaptiveLimiter(16, clock=lambda: now[0])
    first = [limiter.acquire() for _ in range(8)]
    for epoch in first:  # eight answers to requests that all went out before the first 429
        limiter.release(epoch, 429, {"retry-after-ms": "250"})
    # one decrease for the burst: the window by a fifth, the pace to under 1 / Retry-After
    assert limiter.window == pytest.approx(16 * 0.8) and limiter.resume_at == pytest.approx(100.25)
    assert limiter.counts["decreases"] == 1 and limiter.pace == pytest.approx(0.9 * 4)
    now[0] = 101.0
    later = limiter.acquire()  # sent after the decrease: its 429 is news and lowers both again
    limiter.release(later, 429, {})
    assert limiter.window == pytest.approx(16 * 0.8 * 0.8) and limiter.resume_at == pytest.approx(102.0)
    assert limiter.pace == pytest.approx(0.9 * 0.9 * 4)
    for _ in range(30):  # clean answers: the pace wins the last decrease back
        now[0] += 1.0
        limiter.release(limiter.acquire(), 200, {})
    assert limiter.pace == pytest.approx(0.9 * 4, rel=0.01) and limiter.window > 16 * 0.8
    now[0] += 1.0
    limiter.release(limiter.acquire(), 200, {"x-ratelimit-limit-requests": "600"})
    assert limiter.pace <= 600 / 60 * 0.97


def test_retry_after_in_each_form():
    assert retry_after({"retry-after-ms": "820"}) == pytest.approx(0.82)
    assert retry_after({"retry-after": "3"}) == 3.0
    assert 0 < retry_after({"retry-after": "Wed, 21 Oct 2099 07:28:00 GMT"})
    assert retry_after({}) is None
