"""HTTP for the web tools: backend requests with rate-limit retries, and the guarded built-in fetch.

Two kinds of request, two kinds of trust:

* Backend requests (SearXNG, Brave, Tavily, Exa, Firecrawl) go to an endpoint the operator
  configured, so they need no allowlist; `backend_request` retries 429 (and 503 with a
  Retry-After) with backoff and turns every other fault into `BackendError`, which the tools
  report to the model as an error result.
* The built-in fetch reaches URLs the model chose. `GuardedFetcher` checks each URL with the
  run's NetPolicy (scheme, credentials, secrets, literal addresses) before every hop, follows
  redirects itself so every Location is checked the same way, and connects through
  `PinnedBackend`, which resolves the host once, refuses the whole name if any of its
  addresses is off limits, and connects to an address it checked -- so a DNS answer that
  changes between check and connect (rebinding) cannot smuggle a private address in. Bytes,
  time and redirects are capped; the User-Agent says who is fetching.
"""
from __future__ import annotations

import email.utils
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable
from urllib.parse import urljoin

import httpcore
import httpx

from hermes.errors import HermesError
from hermes.netpolicy import NetPolicy, UrlRefused, resolve_host

log = logging.getLogger(__name__)

#: (host, port) -> the addresses to try, in order; tests hand in their own
Resolver = Callable[[str, int], list[str]]


class BackendError(HermesError, RuntimeError):
    """A backend could not answer (down, refused, rate-limited past its retries, malformed reply)."""


# --------------------------------------------------------------------------- retries


def retry_after_seconds(response: httpx.Response) -> float | None:
    """Retry-After as seconds (it may be a number or an HTTP date), or None when absent or unreadable."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def should_retry(response: httpx.Response) -> bool:
    """A rate limit, or an overloaded server that says when to come back."""
    return response.status_code == 429 or (response.status_code == 503 and "retry-after" in response.headers)


def backoff(attempt: int, response: httpx.Response | None, max_wait: float) -> float:
    hinted = retry_after_seconds(response) if response is not None else None
    return min(max_wait, hinted if hinted is not None else 0.5 * 2 ** attempt)


def backend_request(client: httpx.Client, name: str, method: str, url: str, *, retries: int, max_wait: float,
                    **kw: Any) -> Any:
    """One JSON request to a backend; its parsed JSON body. Raises BackendError with a reason the model can read."""
    response = None
    for attempt in range(retries + 1):
        try:
            response = client.request(method, url, **kw)
        except httpx.TimeoutException:
            raise BackendError(f"{name} did not answer in time") from None
        except httpx.TransportError as e:
            raise BackendError(f"{name} is unreachable ({type(e).__name__}: {e})") from None
        if should_retry(response) and attempt < retries:
            wait = backoff(attempt, response, max_wait)
            log.info("%s answered %s; retrying in %.1fs (%d/%d)", name, response.status_code, wait, attempt + 1, retries)
            time.sleep(wait)
            continue
        break
    assert response is not None
    if response.status_code >= 400:
        raise BackendError(f"{name} answered HTTP {response.status_code}: {_error_text(response)}")
    try:
        return response.json()
    except ValueError:
        raise BackendError(f"{name} answered something that is not JSON ({response.headers.get('content-type', '?')})") from None


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200].strip() or response.reason_phrase
    if isinstance(body, dict):
        for key in ("error", "message", "detail"):
            if body.get(key):
                value = body[key]
                return (value.get("message") or str(value)) if isinstance(value, dict) else str(value)[:300]
    return str(body)[:300]


# --------------------------------------------------------------------------- the guarded fetch


class PinnedBackend(httpcore.NetworkBackend):
    """Resolve once, check every address, connect only to a checked one."""

    def __init__(self, policy: NetPolicy, resolver: Resolver | None = None, inner: httpcore.NetworkBackend | None = None):
        self.policy = policy
        self.resolver = resolver or resolve_host
        self.inner = inner or httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        addresses = self.resolver(host, port)
        if not addresses:
            raise UrlRefused(f"refused: {host} resolves to no address")
        for address in addresses:  # one bad address taints the name: no racing for the good one
            self.policy.check_address(address, host)
        error: Exception | None = None
        for address in addresses:
            try:
                return self.inner.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                              socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                error = e
        assert error is not None
        raise error

    def connect_unix_socket(self, *a: Any, **k: Any) -> httpcore.NetworkStream:
        raise UrlRefused("refused: unix sockets are never fetched")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class PinnedTransport(httpx.HTTPTransport):
    """httpx's own transport, its connection pool built on PinnedBackend (httpx has no public
    knob for the network backend, so the pool it made is replaced with an equal one that has it)."""

    def __init__(self, backend: PinnedBackend, *, verify: bool = True, limits: httpx.Limits | None = None):
        super().__init__(verify=verify, trust_env=False)
        limits = limits or httpx.Limits(max_connections=20, max_keepalive_connections=10)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections, max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry, network_backend=backend)


@dataclass
class Fetched:
    url: str                 # where the body came from, after redirects
    status: int
    content_type: str
    body: bytes
    truncated: bool          # the body was cut at max_bytes
    encoding: str | None


class FetchError(HermesError, RuntimeError):
    """The page could not be fetched (HTTP error, too large a redirect chain, time-out)."""


class GuardedFetcher:
    """GET model-chosen URLs within the NetPolicy, with caps on bytes, time and redirects."""

    def __init__(self, policy: NetPolicy, *, user_agent: str, timeout: float = 20.0, max_bytes: int = 2_000_000,
                 max_redirects: int = 5, retries: int = 3, max_retry_wait: float = 30.0,
                 resolver: Resolver | None = None, network: httpcore.NetworkBackend | None = None):
        self.policy = policy
        self.timeout, self.max_bytes, self.max_redirects = timeout, max_bytes, max_redirects
        self.retries, self.max_retry_wait = retries, max_retry_wait
        self.client = httpx.Client(
            transport=PinnedTransport(PinnedBackend(policy, resolver, network)), follow_redirects=False,
            trust_env=False,  # a proxy from the environment would connect to an address nobody checked
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            headers={"User-Agent": user_agent, "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5"})

    def close(self) -> None:
        self.client.close()

    def fetch(self, url: str) -> Fetched:
        """Raises UrlRefused (policy) or FetchError (everything else), each with a reason for the model."""
        deadline = time.monotonic() + self.timeout
        attempt = 0
        hops = 0
        while True:
            self.policy.check(url, resolve=False)  # addresses are checked where the connection is made
            if time.monotonic() > deadline:
                raise FetchError(f"gave up on {url}: over the {self.timeout:g}s time limit")
            try:
                with self.client.stream("GET", url) as response:
                    if response.is_redirect:
                        location = response.headers.get("location", "")
                        hops += 1
                        if hops > self.max_redirects:
                            raise FetchError(f"more than {self.max_redirects} redirects, stopped at {url}")
                        url = urljoin(str(response.url), location)
                        continue
                    if should_retry(response) and attempt < self.retries:
                        wait = backoff(attempt, response, self.max_retry_wait)
                        attempt += 1
                        if time.monotonic() + wait > deadline:
                            raise FetchError(f"{url} is rate-limited (HTTP {response.status_code}) past the time limit")
                        response.close()
                        time.sleep(wait)
                        continue
                    if response.status_code >= 400:
                        raise FetchError(f"{url} answered HTTP {response.status_code} {response.reason_phrase}")
                    body, truncated = self._read(response, deadline)
                    return Fetched(str(response.url), response.status_code,
                                   response.headers.get("content-type", ""), body, truncated, response.charset_encoding)
            except httpx.TimeoutException:
                raise FetchError(f"{url} did not answer within {self.timeout:g}s") from None
            except httpx.TransportError as e:
                cause = e.__cause__ or e.__context__
                if isinstance(cause, UrlRefused):
                    raise cause from None
                raise FetchError(f"cannot fetch {url}: {type(e).__name__}: {e}") from None

    def _read(self, response: httpx.Response, deadline: float) -> tuple[bytes, bool]:
        chunks, size = [], 0
        for chunk in response.iter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size >= self.max_bytes:
                return b"".join(chunks)[: self.max_bytes], True
            if time.monotonic() > deadline:
                raise FetchError(f"{response.url} took longer than {self.timeout:g}s to send its page")
        return b"".join(chunks), False
