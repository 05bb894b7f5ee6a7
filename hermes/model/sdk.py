"""The openai SDK's own client, for the calls that stream (the API server's, `chat`'s).

Its own module so that only those import the SDK (hermes.lazyimport): a batch run's calls go
out through hermes.model.calls.
"""
from __future__ import annotations

from typing import Any

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState  # noqa: F401  (hermes.model.client's)

from hermes.model.ratelimit import AdaptiveLimiter


class LimitedHttpClient(openai.DefaultHttpxClient):
    """The SDK's own HTTP client (its defaults), with every request it sends admitted by `limiter`.

    `send` is where each attempt of the SDK's retry loop goes out, so the limiter sees every
    attempt and its answer; the SDK's backoff sleeps happen outside it, holding no place.
    """

    def __init__(self, limiter: AdaptiveLimiter, **kwargs: Any):
        super().__init__(**kwargs)
        self.limiter = limiter

    def send(self, request, **kwargs):  # type: ignore[override]
        epoch = self.limiter.acquire()
        try:
            response = super().send(request, **kwargs)
        except BaseException:
            self.limiter.release(epoch, None)
            raise
        # A streamed answer is released at its headers: a rate limit counts requests as they start.
        self.limiter.release(epoch, response.status_code, response.headers)
        return response
