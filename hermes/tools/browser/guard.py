"""Where a page may connect: the navigation policy on every request, two ways.

1. `route_guard` -- Playwright's context.route("**/*"): every request the page makes (documents,
   scripts, images, XHR/fetch, frames) is checked with the run's NetPolicy before it is sent, and a
   refused one is aborted and recorded, so the tools can name the reason. Works on any backend.
2. `PolicyProxy` -- the local browser's contexts send all traffic through this loopback proxy, which
   checks the host of every connection (and connects to the very address it checked). It catches
   what interception does not see: redirect hops (Playwright continues them without asking the
   route), WebSockets, preconnects. A remote (CDP) browser cannot reach it; there the route is all.
"""
from __future__ import annotations

import asyncio
import html
import logging
from typing import Callable
from urllib.parse import urlsplit

from hermes.netpolicy import NetPolicy, UrlRefused

log = logging.getLogger(__name__)

HEAD_LIMIT = 64 * 1024
CONNECT_TIMEOUT = 15.0
REFUSED_HEADER = "X-Hermes-Refused"
REFUSED_TITLE = "Refused by the navigation policy"


async def check(policy: NetPolicy, url: str) -> list[str]:
    """policy.check off the event loop (it may resolve DNS)."""
    return await asyncio.to_thread(policy.check, url)


def route_guard(policy: NetPolicy, on_refused: Callable[[str, str], None]):
    """A context.route handler enforcing `policy`; on_refused(url, reason) records each refusal."""
    async def handle(route) -> None:
        url = route.request.url
        if urlsplit(url).scheme in ("data", "blob"):  # in-page content: no connection is made
            await route.continue_()
            return
        try:
            await check(policy, url)
        except UrlRefused as e:
            on_refused(url, str(e))
            await route.abort("blockedbyclient")
            return
        await route.continue_()
    return handle


class PolicyProxy:
    """An HTTP proxy on 127.0.0.1 that connects only where the policy allows (HTTP and CONNECT)."""

    def __init__(self, policy: NetPolicy):
        self.policy = policy
        self.refused: list[tuple[str, str]] = []
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=HEAD_LIMIT)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        tasks = list(self._tasks)
        for task in tasks:  # connections still open (a page stalled on a slow server)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        self._tasks.add(asyncio.current_task())
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CONNECT_TIMEOUT)
            lines = head.decode("latin-1").split("\r\n")
            method, target, _version = lines[0].split(" ", 2)
            if method.upper() == "CONNECT":
                host, _, port = target.rpartition(":")
                url = f"https://{host}:{port}/"
            else:
                url = target
                parts = urlsplit(target)
                if parts.scheme != "http" or not parts.hostname:
                    raise UrlRefused(f"refused: the proxy takes absolute http URLs, not {target[:80]!r}")
                host, port = parts.hostname, str(parts.port or 80)
            addresses = await check(self.policy, url)
            # connect to the address the policy checked (no second lookup that could answer otherwise)
            up_reader, upstream = await asyncio.wait_for(
                asyncio.open_connection(addresses[0] if addresses else host.strip("[]"), int(port)), CONNECT_TIMEOUT)
            if method.upper() == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                upstream.write(_origin_form(lines, target))
            sending = asyncio.ensure_future(_pipe(reader, upstream))
            try:
                await _pipe(up_reader, writer)  # the answer ends the exchange (the origin closes it)
            finally:
                sending.cancel()
        except UrlRefused as e:
            self.refused.append((url, str(e)))
            reason = str(e).encode("ascii", "replace").decode()
            body = (f"<html><head><title>{REFUSED_TITLE}</title></head><body><h1>{REFUSED_TITLE}</h1>"
                    f"<p>{html.escape(reason)}</p></body></html>").encode()
            writer.write(f"HTTP/1.1 403 Forbidden\r\nContent-Type: text/html; charset=utf-8\r\n{REFUSED_HEADER}: {reason}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        except (OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            if not writer.is_closing():
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            log.debug("browser proxy: %s", e)
        finally:
            self._tasks.discard(asyncio.current_task())
            for w in (writer, upstream):
                if w is not None:
                    w.close()  # the transport sends what is buffered, then closes


def _origin_form(lines: list[str], target: str) -> bytes:
    """Rewrite an absolute-URI proxy request for the origin; one request per connection, so a
    kept-alive proxy connection can never carry a second request to another host."""
    parts = urlsplit(target)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    method, _, version = lines[0].split(" ", 2)
    headers = [h for h in lines[1:] if h and not h.lower().startswith(("proxy-", "connection:", "keep-alive:"))]
    return "\r\n".join([f"{method} {path} {version}", *headers, "Connection: close", "", ""]).encode("latin-1")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (OSError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass
