"""What each browser tool does to a prompt's page (coroutines run on the browser loop).

Snapshots are Playwright's accessibility ("aria") snapshot in its "ai" mode, which numbers
elements (`[ref=e7]`) and resolves them again with the `aria-ref=e7` selector. We show refs only
on elements a model can act on, as `[ref=@e7]`, and keep the set so a stale or invented ref is
answered with a clear error instead of a long wait.
"""
from __future__ import annotations

import asyncio
import re
from typing import Any

from hermes.tools.browser.service import PromptSession

INTERACTIVE = {"button", "link", "textbox", "searchbox", "checkbox", "radio", "combobox", "listbox", "option",
               "menuitem", "menuitemcheckbox", "menuitemradio", "tab", "switch", "slider", "spinbutton", "treeitem"}
LINE = re.compile(r"^(?P<indent>\s*)- (?P<role>[a-z]+)\b(?P<rest>.*)$")
REF = re.compile(r" \[ref=(?P<ref>[a-z0-9]+)\]")
CURSOR = re.compile(r" \[cursor=pointer\]")
STRUCTURAL = re.compile(r"^\s*- (generic|group|none|presentation)\s*:?$")
ACTION_MS = 10_000       # an element action waits this long for its element
SETTLE_MS = 3_000        # after a navigation, wait this long for its page to load
NAV_GRACE = 0.5          # seconds an action is given to start a navigation
IMAGES_MAX = 100

IMAGES_JS = """(max) => Array.from(document.images).slice(0, max).map(i => ({
  src: i.currentSrc || i.src, alt: i.alt || '', width: i.naturalWidth, height: i.naturalHeight}))"""


def format_snapshot(raw: str, full: bool) -> tuple[str, set[str]]:
    """Keep refs on interactive elements only (as @eN); compact mode drops empty wrapper lines."""
    refs: set[str] = set()
    out = []
    for line in raw.splitlines():
        m = LINE.match(line)
        ref = REF.search(line)
        if m and ref:
            clickable = m["role"] in INTERACTIVE or CURSOR.search(line)
            line = REF.sub(f" [ref=@{ref['ref']}]" if clickable else "", line, count=1)
            if clickable:
                refs.add(ref["ref"])
        line = CURSOR.sub("", line)
        if not full and STRUCTURAL.match(line):
            continue
        out.append(line)
    return "\n".join(out), refs


def cut(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    head = text[:limit].rsplit("\n", 1)[0]
    return (head + f"\n[snapshot cut: {len(head)} of {len(text)} characters shown; use browser_scroll, "
                   "or browser_snapshot with full=false for the compact tree]"), True


async def snapshot(s: PromptSession, full: bool, limit: int) -> dict[str, Any]:
    raw = await s.page.locator("body").aria_snapshot(mode="ai")
    text, refs = format_snapshot(raw, full)
    s.refs = refs
    text, truncated = cut(text, limit)
    return {"success": True, "url": s.page.url, "title": await s.page.title(), "snapshot": text,
            "element_count": len(refs), "truncated": truncated}


async def _settle(s: PromptSession) -> None:
    try:
        await s.page.wait_for_load_state("load", timeout=SETTLE_MS)
    except Exception:  # noqa: BLE001 - a page still loading is shown as it is
        pass


def refused_for(s: PromptSession, url: str) -> str | None:
    return next((reason for u, reason in reversed(s.refused) if u.rstrip("/") == url.rstrip("/")), None)


async def navigate(s: PromptSession, url: str, timeout: float, limit: int) -> dict[str, Any]:
    from playwright.async_api import Error as PlaywrightError

    s.refused.clear()
    try:
        response = await s.page.goto(url, wait_until="domcontentloaded", timeout=timeout * 1000 * 0.8)
    except PlaywrightError as e:
        reason = refused_for(s, url) or (s.refused[-1][1] if s.refused else None)
        if reason:
            return {"success": False, "error": reason, "url": url}
        if "Timeout" in type(e).__name__ or "Timeout" in str(e).split("\n", 1)[0]:
            raise TimeoutError(f"the page did not load within {timeout:g} s") from e
        return {"success": False, "error": str(e).split("\n", 1)[0], "url": url}
    if response is not None and response.headers.get("x-hermes-refused"):
        return {"success": False, "error": response.headers["x-hermes-refused"], "url": response.url}
    await _settle(s)
    result = await snapshot(s, False, limit)
    result["status"] = response.status if response is not None else None
    return result


def _locator(s: PromptSession, ref: str):
    name = ref.strip().lstrip("@")
    if name.startswith("ref="):
        name = name[4:]
    if not s.refs:
        raise LookupError("no snapshot taken on this page yet: call browser_snapshot first")
    if name not in s.refs:
        raise LookupError(f"unknown ref {ref!r}: use a ref from the latest browser_snapshot")
    return s.page.locator(f"aria-ref={name}"), f"@{name}"


async def _acting(s: PromptSession, act) -> None:
    """Run an action; if it starts a navigation (a link, a form sent with Enter), wait for the new page."""
    navigated = asyncio.Event()
    frame = s.page.main_frame

    def seen(f) -> None:
        if f == frame:
            navigated.set()
    s.page.on("framenavigated", seen)
    try:
        await act()
        try:
            await asyncio.wait_for(navigated.wait(), NAV_GRACE)
        except asyncio.TimeoutError:
            return  # nothing navigated: the page changed in place, or not at all
    finally:
        s.page.remove_listener("framenavigated", seen)
    await _settle(s)


async def click(s: PromptSession, ref: str) -> dict[str, Any]:
    locator, shown = _locator(s, ref)
    await _acting(s, lambda: locator.click(timeout=ACTION_MS))
    return {"success": True, "clicked": shown, "url": s.page.url, "title": await s.page.title()}


async def type_text(s: PromptSession, ref: str, text: str) -> dict[str, Any]:
    locator, shown = _locator(s, ref)
    await locator.fill(text, timeout=ACTION_MS)
    return {"success": True, "typed": text, "element": shown}


async def scroll(s: PromptSession, direction: str) -> dict[str, Any]:
    sign = -1 if direction == "up" else 1
    y = await s.page.evaluate("(d) => { window.scrollBy(0, d * window.innerHeight * 0.8); return window.scrollY; }", sign)
    return {"success": True, "direction": direction, "scroll_y": y}


async def back(s: PromptSession) -> dict[str, Any]:
    # "commit": a page restored from the back-forward cache fires no load events
    response = await s.page.go_back(wait_until="commit", timeout=ACTION_MS * 2)
    if response is None and s.page.url in ("about:blank", ""):
        return {"success": False, "error": "no previous page in this tab's history"}
    await _settle(s)
    s.refs = set()
    return {"success": True, "url": s.page.url, "title": await s.page.title()}


async def press(s: PromptSession, key: str) -> dict[str, Any]:
    await _acting(s, lambda: s.page.keyboard.press(key))
    return {"success": True, "pressed": key, "url": s.page.url}


async def get_images(s: PromptSession) -> dict[str, Any]:
    images = await s.page.evaluate(IMAGES_JS, IMAGES_MAX)
    for image in images:
        if image["src"].startswith("data:") and len(image["src"]) > 100:
            image["src"] = image["src"][:100] + "..."
    return {"success": True, "url": s.page.url, "images": images, "count": len(images)}


async def console(s: PromptSession, clear: bool, expression: str | None) -> dict[str, Any]:
    if expression:
        value = await s.page.evaluate(expression)
        return {"success": True, "result": value if isinstance(value, (str, int, float, bool, type(None), list, dict))
                else repr(value)}
    result = {"success": True, "console_messages": list(s.console), "js_errors": list(s.errors),
              "total_messages": len(s.console)}
    if clear:
        s.console.clear()
        s.errors.clear()
    return result
