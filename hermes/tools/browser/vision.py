"""browser_vision: a screenshot of the prompt's page, analysed by the vision backend.

The screenshot half is here (`screenshot`); the analysis needs the vision toolset's backend
(hermes/tools/vision*.py), which is not in this build yet. Until it is, `backend()` returns None
with REASON and the toolset leaves browser_vision out. Wiring it in takes only `analyse()`:
call the backend with the PNG and the question, record its usage under "vision"
(ctx.record_usage), and return {"success", "analysis", "screenshot_path"}.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from hermes.tools.browser.service import PromptSession

REASON = "browser_vision needs the vision backend (hermes/tools/vision*.py), which this build does not have"
PARAMETERS = {"type": "object", "properties": {
    "question": {"type": "string", "description": "what to find out from the page's screenshot"},
    "annotate": {"type": "boolean", "default": False,
                 "description": "draw the snapshot's @e refs onto the screenshot, so the answer can name them"}},
    "required": ["question"]}

ANNOTATE_JS = """(refs) => { for (const [ref, el] of refs) { const r = el.getBoundingClientRect(); const d = document.createElement('div');
  d.textContent = '@' + ref; d.setAttribute('data-hermes-label', '');
  d.style.cssText = `position:fixed;left:${r.left}px;top:${r.top}px;z-index:2147483647;background:#ff0;color:#000;font:10px monospace`;
  document.body.appendChild(d); } }"""


def backend() -> Any | None:
    """The vision backend module, once it exists."""
    try:
        return importlib.import_module("hermes.tools.vision_backend")
    except ImportError:
        return None


async def screenshot(s: PromptSession, path: Path, annotate: bool) -> Path:
    """The viewport as PNG at `path`; with annotate, the interactive refs drawn on it."""
    if annotate and s.refs:
        handles = [(ref, await s.page.locator(f"aria-ref={ref}").element_handle(timeout=2000)) for ref in sorted(s.refs)]
        await s.page.evaluate(ANNOTATE_JS, [(r, h) for r, h in handles if h is not None])
    path.parent.mkdir(parents=True, exist_ok=True)
    await s.page.screenshot(path=str(path))
    if annotate:
        await s.page.evaluate("() => document.querySelectorAll('[data-hermes-label]').forEach(e => e.remove())")
    return path
