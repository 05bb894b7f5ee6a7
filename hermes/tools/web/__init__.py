"""The web toolset: web_search and web_extract, the reference's names, parameters and result shapes.

    web_search(query, limit=5)        -> {"success": true, "data": {"web": [{"title", "url", "description", "position"}]}}
    web_extract(urls, char_limit=15000) -> {"results": [{"url", "title", "content", "error"}]}

Backends are chosen separately for search and extract (settings.py); the tools run in the
orchestrator, never in the prompt's sandbox (whose network stays off). URLs the model chooses
go through the run's NetPolicy (ctx.net: --web_allow_hosts); the backends' own endpoints are
the operator's and need no allowlist. A failing backend gives the call an error result the
model reads and the statistics count; it never ends the run. Extracted pages are kept in the
run folder (web_cache/), so a resumed run does not fetch a URL it already extracted.
"""
from __future__ import annotations

from typing import Any

from hermes.lazyimport import imported
from hermes.tools.registry import Tool, Toolset, register
from hermes.tools.web.settings import WebSettings, unavailable_reason

DEFAULT_CHAR_LIMIT = 15000


def run_search(ctx: Any, args: dict) -> dict:
    return imported("hermes.tools.web.tools").run_search(ctx, args)


def run_extract(ctx: Any, args: dict) -> dict:
    return imported("hermes.tools.web.tools").run_extract(ctx, args)


# --------------------------------------------------------------------------- registration

SEARCH_SCHEMA = {"type": "object", "properties": {
    "query": {"type": "string", "description": "what to search the web for"},
    "limit": {"type": "integer", "description": "how many results (default 5, 1-100)", "minimum": 1, "maximum": 100}},
    "required": ["query"]}

EXTRACT_SCHEMA = {"type": "object", "properties": {
    "urls": {"type": "array", "description": "the pages to read: URLs, or web_search results (objects with a 'url')",
             "items": {"anyOf": [{"type": "string"}, {"type": "object", "properties": {"url": {"type": "string"}},
                                                       "required": ["url"]}]}},
    "char_limit": {"type": "integer", "description": f"most characters per page (default {DEFAULT_CHAR_LIMIT}); "
                                                     "a longer page keeps its start and end"}},
    "required": ["urls"]}

register(Toolset(
    name="web", settings=WebSettings, needs_sandbox=False, available=unavailable_reason,
    description="web search and page extraction: backends, endpoints, fetch limits (API keys come from the environment)",
    tools=[
        Tool(name="web_search", parameters=SEARCH_SCHEMA, run=run_search,
             description="Search the web. Returns titles, URLs and short descriptions of the best matching pages; "
                         "read a page in full with web_extract."),
        Tool(name="web_extract", parameters=EXTRACT_SCHEMA, run=run_extract,
             description="Read web pages: returns each page's title and main text as markdown, without navigation "
                         "or boilerplate. Pass URLs, or results from web_search."),
    ]))
