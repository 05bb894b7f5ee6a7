"""The process's browser and the prompts' sessions in it.

`BrowserService` (one per process, in ctx.shared) owns a thread running an asyncio loop that
holds Playwright's connection to the browser: Playwright objects belong to one loop, and tool
calls come from many prompt threads, which hand it coroutines and wait with the tool's time limit.
It starts the local Chromium (launch.py) or connects to BROWSER_CDP_URL, caps the live contexts
(a semaphore prompt threads wait on), and starts a new browser for the next prompt when the old
one died -- a session made in the dead browser keeps failing, so only the prompt that held it
loses its browsing.

`PromptSession` is one prompt's browser context (its own cookies, storage, cache), its current
page, the console messages seen, the refs of its last snapshot and the requests the policy refused.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Awaitable, Callable

from hermes.errors import HermesError
from hermes.netpolicy import NetPolicy
from hermes.tools.browser.guard import PolicyProxy, check, route_guard
from hermes.tools.browser.launch import LocalChromium, launch
from hermes.tools.browser.settings import BrowserSettings, browser_user, resolve_executable

log = logging.getLogger(__name__)

CONSOLE_KEEP = 200
VIEWPORT = {"width": 1280, "height": 800}


class BrowserLost(HermesError, RuntimeError):
    """The browser of this prompt's session died; the session cannot go on."""


class PromptSession:
    def __init__(self, service: "BrowserService", context: Any, generation: int):
        self.service = service
        self.context = context
        self.generation = generation
        self.page: Any = None
        self.console: list[dict] = []
        self.errors: list[str] = []
        self.refused: list[tuple[str, str]] = []
        self.refs: set[str] = set()
        self.lost: str | None = None
        self.closed = False
        self._watched: set[int] = set()

    # ---------------------------------------------------------------- in the loop

    async def new_page(self) -> Any:
        page = await self.context.new_page()
        self._watch(page)
        return page

    def _watch(self, page: Any) -> None:
        self.page = page  # the newest page (a popup, a target=_blank link) is the one the tools act on
        self.refs = set()
        if id(page) in self._watched:  # the context's "page" event and new_page() both report a new page
            return
        self._watched.add(id(page))
        page.on("console", lambda m: self._keep(self.console, {"type": m.type, "text": m.text[:2000]}))
        page.on("pageerror", lambda e: self._keep(self.errors, str(e)[:2000]))

    @staticmethod
    def _keep(into: list, item: Any) -> None:
        into.append(item)
        del into[:-CONSOLE_KEEP]

    def note_refused(self, url: str, reason: str) -> None:
        self._keep(self.refused, (url, reason))

    async def reset_page(self) -> None:
        """Replace a page that hangs or loops (its renderer is stopped with it)."""
        old, self.page = self.page, None
        if old is not None:
            try:
                await asyncio.wait_for(old.close(run_before_unload=False), 10)
            except Exception as e:  # noqa: BLE001 - a wedged page may not even close; a new one is what matters
                log.debug("closing a hung page: %s", e)
        await self.new_page()

    # ---------------------------------------------------------------- from prompt threads

    def run(self, make: Callable[["PromptSession"], Awaitable[Any]], timeout: float) -> Any:
        """Run make(self) on the browser loop within `timeout`; raises TimeoutError or BrowserLost."""
        if self.lost:
            raise BrowserLost(self.lost)
        if not self.service.alive(self.generation):
            self.lost = "the browser this prompt was using stopped; its browsing session (pages, cookies) is lost"
            raise BrowserLost(self.lost)
        try:
            return self.service.call(make(self), timeout)
        except TimeoutError:
            try:
                self.service.call(self.reset_page(), 15)
            except Exception as e:  # noqa: BLE001
                self.lost = f"the page stopped answering and could not be replaced ({type(e).__name__}: {e})"
            raise
        except Exception as e:
            if not self.service.alive(self.generation):
                self.lost = f"the browser this prompt was using stopped ({type(e).__name__}: {str(e)[:200]})"
                raise BrowserLost(self.lost) from e
            raise

    def close(self) -> None:
        """End of the prompt, however it ended: close the context, free the slot."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.service.alive(self.generation):
                self.service.call(self.context.close(), 15)
        except Exception as e:  # noqa: BLE001 - the slot must be freed whatever happened
            log.debug("closing a browser context: %s", e)
        finally:
            self.service.slots.release()


class BrowserService:
    """One browser for the process; prompts get contexts in it (see module notes)."""

    def __init__(self, settings: BrowserSettings, cdp_url: str | None = None):
        self.settings = settings
        self.cdp_url = cdp_url
        self.slots = threading.BoundedSemaphore(settings.max_contexts)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="hermes-browser", daemon=True)
        self._thread.start()
        self._pw: Any = None
        self._browser: Any = None
        self.local: LocalChromium | None = None
        self.generation = 0
        self._dead_generation = -1
        self._proxies: dict[NetPolicy, PolicyProxy] = {}
        self._lock: asyncio.Lock | None = None
        self._closed = False

    def call(self, coro: Awaitable[Any], timeout: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self.loop)
        try:
            return future.result(timeout + 30)  # the loop's own wait_for answers first; this bounds a stuck loop
        except asyncio.TimeoutError as e:
            future.cancel()
            raise TimeoutError(f"did not finish within {timeout:g} s") from e

    def alive(self, generation: int) -> bool:
        b = self._browser
        return generation == self.generation and self._dead_generation != generation and b is not None and b.is_connected()

    # ---------------------------------------------------------------- sessions

    def open_session(self, policy: NetPolicy) -> PromptSession:
        """A new context for one prompt; waits for a free slot (the process-wide cap)."""
        if self._closed:
            raise RuntimeError("the browser service is closed")
        if not self.slots.acquire(timeout=self.settings.context_wait):
            raise TimeoutError(f"no browser context free within {self.settings.context_wait:g} s "
                               f"({self.settings.max_contexts} live; --browser_max_contexts)")
        try:
            return self.call(self._open(policy), self.settings.launch_timeout + 30)
        except BaseException:
            self.slots.release()
            raise

    async def _open(self, policy: NetPolicy) -> PromptSession:
        await self._ensure_browser()
        options: dict[str, Any] = {"accept_downloads": False, "service_workers": "block", "viewport": VIEWPORT,
                                   "java_script_enabled": True}
        if self.local is not None:
            proxy = self._proxies.get(policy)
            if proxy is None:  # started before it is shared: a context made meanwhile must not see port 0
                proxy = PolicyProxy(policy)
                await proxy.start()
                if policy in self._proxies:
                    await proxy.close()
                proxy = self._proxies.setdefault(policy, proxy)
            # "<-loopback>": loopback goes through the proxy too (Chromium bypasses proxies for it by default)
            options["proxy"] = {"server": f"http://127.0.0.1:{proxy.port}", "bypass": "<-loopback>"}
        context = await self._browser.new_context(**options)
        session = PromptSession(self, context, self.generation)
        await context.route("**/*", route_guard(policy, session.note_refused))
        await context.route_web_socket("**/*", _websocket_guard(policy, session.note_refused))
        context.on("page", session._watch)
        await session.new_page()
        return session

    async def _ensure_browser(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._browser is not None and self._browser.is_connected() and self._dead_generation != self.generation:
                return
            await self._drop_browser()
            if self._pw is None:
                from playwright.async_api import async_playwright

                self._pw = await async_playwright().start()
            ms = self.settings.launch_timeout * 1000
            if self.cdp_url:
                browser = await self._pw.chromium.connect_over_cdp(self.cdp_url, timeout=ms)
            else:
                executable = resolve_executable(self.settings)
                if executable is None:
                    raise RuntimeError("no local Chromium found")
                # launched from the loop's thread, which lives as long as the service: the parent-death
                # signal fires when the process dies, not when some short-lived worker thread ends
                self.local = launch(executable, browser_user(self.settings), self.settings.launch_timeout)
                browser = await self._pw.chromium.connect_over_cdp(self.local.endpoint, timeout=ms)
            self.generation += 1
            generation = self.generation
            browser.on("disconnected", lambda _b: self._mark_dead(generation))
            self._browser = browser
            log.info("browser %d ready (%s)", generation, "remote CDP" if self.cdp_url else f"local, pid {self.local.proc.pid}")

    def _mark_dead(self, generation: int) -> None:
        if generation == self.generation and not self._closed:
            self._dead_generation = generation
            log.warning("the browser stopped; the next prompt that browses gets a new one")

    async def _drop_browser(self) -> None:
        browser, self._browser = self._browser, None
        if browser is not None:
            try:
                await asyncio.wait_for(browser.close(), 10)
            except Exception as e:  # noqa: BLE001 - it is being replaced because it is broken
                log.debug("closing the old browser: %s", e)
        if self.local is not None:
            local, self.local = self.local, None
            await asyncio.to_thread(local.close)

    # ---------------------------------------------------------------- end of the run

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            await self._drop_browser()
            for proxy in self._proxies.values():
                await proxy.close()
            if self._pw is not None:
                await self._pw.stop()

        try:
            self.call(shutdown(), 60)
        except Exception as e:  # noqa: BLE001
            log.warning("closing the browser: %s", e)
            if self.local is not None:
                self.local.close()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)


def _websocket_guard(policy: NetPolicy, on_refused: Callable[[str, str], None]):
    from hermes.netpolicy import UrlRefused

    async def handle(ws) -> None:
        url = ws.url
        try:
            await check(policy, url.replace("ws://", "http://", 1).replace("wss://", "https://", 1))
        except UrlRefused as e:
            on_refused(url, str(e))
            await ws.close(code=1008, reason="refused by the navigation policy")
            return
        ws.connect_to_server()
    return handle
