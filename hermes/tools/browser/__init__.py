"""The browser toolset: a real browser, one isolated context per prompt (the reference's tools).

Tools: browser_navigate, browser_snapshot, browser_click, browser_type, browser_scroll,
browser_back, browser_press, browser_get_images, browser_vision (a screenshot the vision
toolset's model looks at: vision.py; offered when the vision toolset is registered) and
browser_console. Snapshots are the page's accessibility tree; interactive
elements carry refs `@e1`, `@e2`, ... that click and type take.

DESIGN NOTES
- Backends (--browser_backend): `local` -- Debian's Chromium (/usr/bin/chromium; no browser is
  ever downloaded at run time), or `cdp` -- any browser at BROWSER_CDP_URL (hosted browsers).
  `auto` (default) takes BROWSER_CDP_URL when it is set, else the local Chromium. Both are driven
  the same way: Playwright's connect_over_cdp, so local and remote share every code path.
- The local browser runs unprivileged WITH Chromium's own sandbox: we start it ourselves through
  `setpriv` as the dedicated user `hermes-browser` (bootstrap.sh creates it; `nobody` otherwise),
  never as root with --no-sandbox. Chromium's namespace sandbox needs unprivileged user namespaces;
  this machine has them (a run as nobody shows the renderer zygotes in their own user and pid
  namespaces), and no setuid chrome-sandbox helper is needed. Chosen over a container because it
  keeps one code path with the remote backend, starts in about a second, and needs no image. The
  CDP port listens on 127.0.0.1 only (Docker sandboxes have their own network namespace and cannot
  reach it). Each launch has a fresh profile folder; a run killed with SIGKILL takes its browser
  along (parent-death signal), and the next launch sweeps any profile whose owner died (launch.py).
- Isolation: each prompt gets its own browser context (cookies, storage, cache), made on its first
  browser call and closed by ctx.on_close however the prompt ends; at most --browser_max_contexts
  live at once per process (others wait). A dead browser is replaced for the next prompt; the
  prompt that held it gets errors from then on (its session is gone), no other prompt does.
- Navigation policy (hermes/netpolicy.py, --web_allow_hosts): non-http(s) schemes and loopback,
  private, link-local... addresses are refused unless allowlisted -- checked before navigating,
  on every request the page makes (context.route "**/*", WebSockets too), and, for the local
  browser, at every connection through a loopback policy proxy (guard.py), which also covers
  redirect hops Playwright's route does not see. Downloads are off; service workers blocked;
  DNS prefetch and preconnect off in the profile. Remaining gap: a remote CDP browser connects
  from its own network and only the route check applies there.
- Time limit (--browser_timeout): a call that does not finish in time (a page that hangs or loops)
  is answered with an error and the page is closed, its renderer with it; the next call starts
  on a blank page.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from hermes.netpolicy import UrlRefused
from hermes.tools.browser import actions
from hermes.tools.browser.service import BrowserLost, BrowserService, PromptSession
from hermes.tools.browser.settings import CDP_ENV, BrowserSettings, available, use_cdp
from hermes.tools.browser import vision
from hermes.tools.registry import Tool, Toolset, register

SHARED_NAME = "browser"


def _settings(ctx: Any) -> BrowserSettings:
    return ctx.settings if isinstance(ctx.settings, BrowserSettings) else BrowserSettings()


def session_of(ctx: Any) -> PromptSession:
    """This prompt's browser session, made on first use and closed when the prompt ends."""
    lock = ctx.prompt_state.setdefault("browser_lock", threading.Lock())
    with lock:
        session = ctx.prompt_state.get("browser")
        if session is None:
            settings = _settings(ctx)
            cdp_url = ctx.secret(CDP_ENV) if use_cdp(settings, ctx.secret) else None
            service = ctx.shared.get(SHARED_NAME, lambda: BrowserService(settings, cdp_url))
            session = service.open_session(ctx.net)
            ctx.prompt_state["browser"] = session
            ctx.on_close(session.close)
    return session


def _tool(name: str, action: Callable[[PromptSession, dict, BrowserSettings], Any], *, checks_url: bool = False):
    def run(ctx: Any, args: dict) -> dict:
        from playwright.async_api import Error as PlaywrightError

        settings = _settings(ctx)
        if checks_url:
            try:  # refused before the browser is involved: no connection is ever attempted
                ctx.net.check(args["url"])
            except UrlRefused as e:
                return {"success": False, "error": str(e), "url": args["url"]}
        try:
            session = session_of(ctx)
        except Exception as e:  # noqa: BLE001 - no browser: this call fails, the prompt goes on
            return {"success": False, "error": f"no browser available: {type(e).__name__}: {e}"}
        try:
            return session.run(lambda s: action(s, args, settings), settings.timeout)
        except TimeoutError:
            return {"success": False, "error": f"{name} did not finish within {settings.timeout:g} s (the page hangs "
                                                f"or loops); the page was stopped and a blank one opened"}
        except (BrowserLost, LookupError) as e:
            return {"success": False, "error": str(e)}
        except PlaywrightError as e:
            return {"success": False, "error": str(e).strip().split("\n", 1)[0][:500]}
    return run


def _obj(properties: dict | None = None, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": properties or {}, "required": required or []}


REF = {"type": "string", "description": "an element's ref from the latest snapshot, e.g. @e3"}

TOOLS = [
    Tool("browser_navigate", "Open a URL in the browser and return the page's compact accessibility snapshot "
         "(interactive elements carry refs such as @e3 for browser_click and browser_type).",
         _obj({"url": {"type": "string", "description": "the http(s) URL to open"}}, ["url"]),
         _tool("browser_navigate", lambda s, a, st: actions.navigate(s, a["url"], st.timeout, st.snapshot_chars),
               checks_url=True), exclusive=True),
    Tool("browser_snapshot", "The current page as a text accessibility tree; interactive elements carry refs "
         "(@e1, @e2, ...). full=true keeps every wrapper element.",
         _obj({"full": {"type": "boolean", "default": False, "description": "the whole tree, not the compact one"}}),
         _tool("browser_snapshot", lambda s, a, st: actions.snapshot(s, bool(a.get("full")), st.snapshot_chars)),
         exclusive=True),
    Tool("browser_click", "Click the element with this ref (from the latest snapshot).", _obj({"ref": REF}, ["ref"]),
         _tool("browser_click", lambda s, a, st: actions.click(s, a["ref"])), exclusive=True),
    Tool("browser_type", "Type text into the input element with this ref, replacing what it held.",
         _obj({"ref": REF, "text": {"type": "string", "description": "the text to type"}}, ["ref", "text"]),
         _tool("browser_type", lambda s, a, st: actions.type_text(s, a["ref"], a["text"])), exclusive=True),
    Tool("browser_scroll", "Scroll the page up or down by most of a screen.",
         _obj({"direction": {"type": "string", "enum": ["up", "down"]}}, ["direction"]),
         _tool("browser_scroll", lambda s, a, st: actions.scroll(s, a["direction"])), exclusive=True),
    Tool("browser_back", "Go back to the previous page.", _obj(),
         _tool("browser_back", lambda s, a, st: actions.back(s)), exclusive=True),
    Tool("browser_press", "Press a key on the focused element (Enter, Tab, Escape, ArrowDown, Control+A, ...).",
         _obj({"key": {"type": "string", "description": "the key, as Playwright names keys"}}, ["key"]),
         _tool("browser_press", lambda s, a, st: actions.press(s, a["key"])), exclusive=True),
    Tool("browser_get_images", "List the images of the current page (src, alt text, size).", _obj(),
         _tool("browser_get_images", lambda s, a, st: actions.get_images(s)), exclusive=True),
    Tool("browser_console", "The page's console messages and JavaScript errors, or the value of a JavaScript "
         "expression evaluated in the page.",
         _obj({"clear": {"type": "boolean", "description": "empty the message buffer after reading it"},
               "expression": {"type": "string", "description": "JavaScript to evaluate in the page"}}),
         _tool("browser_console", lambda s, a, st: actions.console(s, bool(a.get("clear")), a.get("expression"))),
         exclusive=True),
]


def _vision(ctx: Any, args: dict) -> dict:
    """browser_vision: the screenshot on the browser loop (within the time limit), the analysis
    after it, outside the loop, so a slow vision model never holds the page up."""
    annotate = bool(args.get("annotate"))
    shot = _tool("browser_vision", lambda s, a, st: vision.screenshot(s, annotate))(ctx, args)
    if isinstance(shot, dict):  # an error result: no browser, the page hung...
        return shot
    return vision.analyse(ctx, shot, args["question"], annotate)


_description = "a real browser per prompt (local Chromium or a remote CDP browser)"
if vision.backend() is None:
    _description += f"; browser_vision is left out: {vision.REASON}"
else:
    TOOLS.insert(next(i for i, t in enumerate(TOOLS) if t.name == "browser_get_images") + 1, Tool(
        "browser_vision", "Take a screenshot of the current page and ask a vision model about it (layout, charts, "
        "images, text the snapshot does not show). annotate=true draws the interactive elements' refs (@e1, ...) "
        "onto it, so the answer can name them for browser_click.",
        vision.PARAMETERS, _vision, exclusive=True))

register(Toolset(name="browser", tools=TOOLS, settings=BrowserSettings, needs_sandbox=False, available=available,
                 description=_description, flag_prefix="browser"))
