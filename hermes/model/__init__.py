"""The model endpoint: the client, the run's calls from one event loop, rate limiting.

    client.py     ModelClient: one chat completion (sync or async), its errors (ModelError)
    calls.py      the run's model calls from one event loop over aiohttp (Endpoint, CallLoop)
    sdk.py        the openai SDK's rate-limited HTTP client, imported on first use
    ratelimit.py  the run-wide adaptive limiter (RPM, in-flight, Retry-After)
"""
from hermes.lazyimport import lazy_surface

__getattr__, __all__ = lazy_surface(__name__, {
    "ModelClient": "client",
    "ModelError": "client",
    "Reply": "client",
    "extra_body": "client",
    "Endpoint": "calls",
    "CallLoop": "calls",
    "CallError": "calls",
    "AdaptiveLimiter": "ratelimit",
    "retry_after": "ratelimit",
})
