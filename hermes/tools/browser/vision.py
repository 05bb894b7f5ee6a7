"""browser_vision: a screenshot of the prompt's page, analysed by the vision toolset's model.

The screenshot is taken here (on the browser loop, within --browser_timeout) and saved in the run
folder as images/<prompt key>-<call id>.png (hermes.tools.images.save, as image_generate saves);
the analysis is the vision toolset's own (hermes.tools.vision.analyse), with the vision toolset's
settings taken from the prompt's combined settings, so browser_vision resolves endpoint, model
and key exactly as vision_analyze does and its usage is counted as "vision". The browser toolset
offers browser_vision only when the vision toolset is registered (`backend()`); a vision toolset
that is registered but has no model configured gives a clear error result instead.
"""
from __future__ import annotations

import importlib
from typing import Any

from hermes.tools import images
from hermes.tools.browser import actions
from hermes.tools.browser.service import PromptSession
from hermes.tools.registry import settings_of, toolsets

VISION = "vision"  # the toolset whose model looks at the screenshot
REASON = "browser_vision needs the vision toolset (hermes/tools/vision.py), which is not registered in this build"
PARAMETERS = {"type": "object", "properties": {
    "question": {"type": "string", "description": "what to find out from the page's screenshot"},
    "annotate": {"type": "boolean", "default": False,
                 "description": "draw the page's @e refs onto the screenshot, so the answer can name them"}},
    "required": ["question"]}
#: what the vision model is told besides the question (after it: the question comes first)
CONTEXT = "\n\n(This image is a screenshot of a web page.)"
LABELS = ("\n\n(This image is a screenshot of a web page; its interactive elements are labelled with their refs "
          "-- @e1, @e2, ... in yellow tags -- so name elements by those refs.)")
LABEL_JS = """(el, ref) => { const r = el.getBoundingClientRect(); const d = document.createElement('div');
  d.textContent = '@' + ref; d.setAttribute('data-hermes-label', '');
  d.style.cssText = `position:fixed;left:${r.left}px;top:${r.top}px;z-index:2147483647;background:#ff0;color:#000;font:10px monospace`;
  document.body.appendChild(d); }"""


def backend() -> Any | None:
    """The vision toolset's module when that toolset is registered, else None.

    Importing it registers it (once: the tools package imports the same module); the browser
    toolset asks at its own registration, so the tool list is fixed from then on."""
    try:
        module = importlib.import_module("hermes.tools.vision")
    except ImportError:
        return None
    return module if VISION in toolsets() and hasattr(module, "analyse") else None


async def screenshot(s: PromptSession, annotate: bool) -> bytes:
    """The viewport as PNG bytes; with annotate, the current page's interactive refs drawn on it.

    Annotating takes a fresh snapshot first, so the refs drawn are the page's now (they become the
    refs browser_click accepts, as after browser_snapshot) and none is stale from an earlier page."""
    if annotate:
        await actions.snapshot(s, False, 1)
        for ref in sorted(s.refs, key=lambda r: int(r[1:]) if r[1:].isdigit() else 0):
            try:
                await s.page.locator(f"aria-ref={ref}").evaluate(LABEL_JS, ref, timeout=1000)
            except Exception:  # noqa: BLE001 - an element gone since the snapshot is simply not labelled
                pass
    try:
        return await s.page.screenshot(type="png")
    finally:
        if annotate:
            await s.page.evaluate("() => document.querySelectorAll('[data-hermes-label]').forEach(e => e.remove())")


def analyse(ctx: Any, png: bytes, question: str, annotate: bool) -> dict:
    """Save the screenshot, ask the vision model about it; the browser_vision result."""
    vision = backend()
    if vision is None:
        return {"success": False, "error": REASON}
    settings = settings_of(ctx.prompt.settings, VISION) or vision.VisionSettings()
    try:
        image = images.as_image(png, "the page's screenshot", settings.max_image_bytes)
    except images.ImageError as e:
        return {"success": False, "error": str(e)}
    path = images.save(ctx, image.data, images.EXT[image.format])
    prompt = question + (LABELS if annotate else CONTEXT)
    result = vision.analyse(ctx, image, prompt, settings)
    if not result.get("success"):
        return {"success": False, "error": result.get("error") or "the vision model gave no analysis",
                "screenshot_path": path}
    return {"success": True, "analysis": result["analysis"], "screenshot_path": path}
