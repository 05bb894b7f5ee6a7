"""The browser's address rules, with every request the browser sends caught by a trap the test owns.

The browser here is the toolset's CDP backend (--browser_backend=cdp, BROWSER_CDP_URL): a real
Chromium started the product's way (launch.py, unprivileged, its own sandbox) with one flag more,
`--proxy-server` naming the test's trap proxy on 127.0.0.1 and `--proxy-bypass-list=<-loopback>`,
so every request it makes, loopback included, goes to the trap and nowhere else. The trap records
each request's host and answers every one itself (it serves the test's pages too), so nothing ever
leaves the machine: a rule that let a private address through would show as the trap's record of
that address and fail the test, not as a packet to 10.0.0.1.

On the CDP backend the toolset's own checks are all there is (the navigation check, then the
route guard on every request a page makes): a remote browser cannot use the local policy proxy.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from hermes.netpolicy import NetPolicy
from hermes.tools import SharedResources, ToolContext, run_tool, toolset_settings_model
from hermes.tools.browser.launch import launch
from hermes.tools.browser.settings import CDP_ENV, BrowserSettings, available, browser_user, resolve_executable
from tests.helpers import until

pytestmark = pytest.mark.skipif(available(BrowserSettings(), lambda _: None) is not None and not os.environ.get("CI"),
                                reason=f"browser toolset unavailable: {available(BrowserSettings(), lambda _: None)}")

#: addresses a model must not reach, and what the refusal calls each (hermes/netpolicy.py)
PRIVATE = [("10.0.0.1", "private"), ("192.168.1.1", "private"), ("172.16.0.1", "private"),
           ("169.254.169.254", "cloud metadata"), ("100.100.100.200", "cloud metadata"),
           ("169.254.1.1", "link-local"), ("100.64.0.1", "carrier-grade NAT (shared)"),
           ("100.127.255.254", "carrier-grade NAT (shared)"), ("[fe80::1]", "link-local"),
           ("[fd00::1]", "private"), ("[fd12:3456:789a::1]", "private")]


class TrapHandler(BaseHTTPRequestHandler):
    """Answers every proxied request itself; /sub is a page whose subrequests go where its query says."""

    server: "TrapProxy"

    def log_message(self, *a):
        pass

    def _record(self) -> None:
        if self.command == "CONNECT":
            host = self.path.rpartition(":")[0].strip("[]")
        else:
            host = urlsplit(self.path).hostname or ""
        with self.server.lock:
            self.server.seen.append((self.command, host, self.path))

    def do_CONNECT(self):  # an https request: recorded, then refused (the trap holds no certificates)
        self._record()
        self.send_response(502)
        self.send_header("Content-Length", "0")
        self.end_headers()

    # plain-http uploads (an updater's POST) are recorded too, not answered 501 unseen
    do_POST = do_PUT = do_HEAD = do_OPTIONS = do_DELETE = do_PATCH = do_CONNECT

    def do_GET(self):
        self._record()
        parts = urlsplit(self.path)
        if parts.path == "/sub":
            targets = parse_qs(parts.query).get("to", [])
            body = "<h1>Subrequests</h1>" + "".join(
                f"<img src='{t}/img' alt=img{i}><iframe src='{t}/frame'></iframe>"
                f"<script>fetch('{t}/xhr').catch(() => console.log('xhr refused'))</script>"
                for i, t in enumerate(targets))
            title = "Sub"
        else:
            title, body = "Trap", f"<h1>trap reached {self.path}</h1>"
        data = f"<!doctype html><html><head><title>{title}</title></head><body>{body}</body></html>".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


class TrapProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), TrapHandler)
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str, str]] = []

    @property
    def port(self) -> int:
        return self.server_address[1]

    def hosts(self) -> set[str]:
        with self.lock:
            return {host for _, host, _ in self.seen}

    def requests(self) -> list[str]:
        with self.lock:
            return [f"{method} {target}" for method, _, target in self.seen]

    def saw(self, host: str) -> list[str]:
        host = host.strip("[]")
        with self.lock:
            return [f"{method} {target}" for method, h, target in self.seen if h == host]


@contextlib.contextmanager
def serving_trap():
    proxy = TrapProxy()
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()


@contextlib.contextmanager
def trapped_chromium(trap: TrapProxy):
    """The product's local Chromium (launch.FLAGS, unprivileged) whose every request goes to the trap."""
    settings = BrowserSettings()
    chromium = launch(resolve_executable(settings), browser_user(settings), settings.launch_timeout,
                      (f"--proxy-server=http://127.0.0.1:{trap.port}", "--proxy-bypass-list=<-loopback>"))
    try:
        yield chromium
    finally:
        chromium.close()


@pytest.fixture(scope="module")
def trap():
    with serving_trap() as proxy:
        yield proxy


@pytest.fixture(scope="module")
def cdp_endpoint(trap):
    """A Chromium whose every request goes to the trap, reached over CDP as a remote browser would be."""
    with trapped_chromium(trap) as chromium:
        yield chromium.endpoint


@pytest.fixture(scope="module")
def shared(cdp_endpoint):
    resources = SharedResources()
    yield resources
    resources.close()


@pytest.fixture
def prompt(shared, cdp_endpoint):
    made = []

    def make(allow=("127.0.0.1",)) -> ToolContext:
        ctx = ToolContext(settings=toolset_settings_model()(browser=BrowserSettings(backend="cdp")),
                          net=NetPolicy.from_hosts(list(allow)), shared=shared,
                          secret=lambda name: cdp_endpoint if name == CDP_ENV else None)
        made.append(ctx)
        return ctx
    yield make
    for ctx in made:
        ctx.close()


def call(ctx: ToolContext, name: str, **args) -> dict:
    return json.loads(run_tool(name, args, ctx))


def test_the_trap_sees_what_the_browser_sends(prompt, trap):
    """The control: an allowed page is served by the trap, so a request that got through would be seen."""
    ctx = prompt()
    page = call(ctx, "browser_navigate", url=f"http://127.0.0.1:{trap.port}/control")
    assert page["success"] and "trap reached" in page["snapshot"], page
    assert f"GET http://127.0.0.1:{trap.port}/control" in trap.saw("127.0.0.1")


@pytest.mark.parametrize("address, kind", PRIVATE)
def test_a_private_address_is_refused_and_never_requested(prompt, trap, address, kind):
    ctx = prompt()
    for url in (f"http://{address}/", f"https://{address}/", f"http://{address}:8080/admin"):
        result = call(ctx, "browser_navigate", url=url)
        assert result["success"] is False and f"{address.strip('[]')} is a {kind} address" in result["error"], result
    # the browser was asked for an allowed page afterwards: had it been sent the refused ones, the trap would hold them
    assert call(ctx, "browser_navigate", url=f"http://127.0.0.1:{trap.port}/after")["success"]
    assert trap.saw(address) == []


def test_a_pages_subrequests_to_private_addresses_are_refused_before_they_are_sent(prompt, trap):
    ctx = prompt()
    targets = [f"http://{a}" for a, _ in PRIVATE]
    query = "&".join(f"to={t}" for t in targets)
    page = call(ctx, "browser_navigate", url=f"http://127.0.0.1:{trap.port}/sub?{query}")
    assert page["success"] and "Subrequests" in page["snapshot"], page
    session = ctx.prompt_state["browser"]
    wanted = {f"{t}/{kind}" for t in targets for kind in ("img", "xhr")}

    def leaked() -> dict:
        return {a: trap.saw(a) for a, _ in PRIVATE if trap.saw(a)}
    # every image and fetch of every private address refused by the route guard (or one reached the trap)
    until(lambda: leaked() or wanted <= {url for url, _ in session.refused}, "every subrequest's refusal", timeout=30)
    assert leaked() == {}
    assert wanted <= {url for url, _ in session.refused}


def test_cidr_allowlist_entries_let_their_addresses_through_and_no_others(prompt, trap):
    ctx = prompt(allow=("127.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "fd00::/8"))
    for address in ("10.20.30.40", "100.64.7.7", "[fd00::99]"):
        page = call(ctx, "browser_navigate", url=f"http://{address}/inside")
        assert page["success"] and "trap reached" in page["snapshot"], page
        assert f"GET http://{address}/inside" in trap.saw(address)
    for address, kind in (("192.168.1.1", "private"), ("172.16.0.1", "private"), ("[fc00::1]", "private"),
                          ("169.254.169.254", "cloud metadata"), ("100.128.0.1", None)):
        result = call(ctx, "browser_navigate", url=f"http://{address}/outside")
        if kind is None:  # just past 100.64/10: a public address, the trap (standing in for the internet) answers
            assert result["success"] and trap.saw(address), result
            continue
        assert result["success"] is False and f"is a {kind} address" in result["error"], result
        assert trap.saw(address) == []
    # a page on an allowed range cannot pull in addresses outside it
    page = call(ctx, "browser_navigate", url="http://10.0.0.5/sub?to=http://192.168.7.7&to=http://10.0.0.6")
    assert page["success"], page
    until(lambda: "http://192.168.7.7/img" in {url for url, _ in ctx.prompt_state["browser"].refused},
          "the refusal of the page's image outside the allowed range", timeout=30)
    until(lambda: trap.saw("10.0.0.6"), "the page's subrequest inside the allowed range", timeout=30)
    assert trap.saw("192.168.7.7") == []


#: how long the browser idles on its page: Chromium's own startup traffic (sign-in's ListAccounts,
#: network time, on-demand component and optimization-guide fetches) goes out within the first seconds
IDLE_S = 6.0


def test_the_browser_itself_contacts_no_host_but_the_page_it_was_sent_to():
    """Chromium's background services (component updater, sign-in, optimization guide, network time,
    ...) bypass the page-level checks and would go straight out from the user's machine; with the
    product's launch flags the only requests the trap sees are the ones for the allowed page."""
    with serving_trap() as own, trapped_chromium(own) as chromium:
        resources = SharedResources()
        ctx = ToolContext(settings=toolset_settings_model()(browser=BrowserSettings(backend="cdp")),
                          net=NetPolicy.from_hosts(["127.0.0.1"]), shared=resources,
                          secret=lambda name: chromium.endpoint if name == CDP_ENV else None)
        try:
            page = call(ctx, "browser_navigate", url=f"http://127.0.0.1:{own.port}/idle")
            assert page["success"] and f"trap reached http://127.0.0.1:{own.port}/idle" in page["snapshot"], page
            time.sleep(IDLE_S)  # idling is the point: what the browser sends of its own accord
        finally:
            ctx.close()
            resources.close()
        page_host = f"http://127.0.0.1:{own.port}/"
        assert f"GET {page_host}idle" in own.requests()
        assert [r for r in own.requests() if not r.split(" ", 1)[1].startswith(page_host)] == []
