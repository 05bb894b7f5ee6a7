"""What web_search and web_extract do (loaded on their first call, so runs without web tools
never import the HTTP stack)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx

from hermes.netpolicy import UrlRefused
from hermes.tools.web.extract import EXTRACT_BACKENDS, ExtractCall, page
from hermes.tools.web.http import BackendError, GuardedFetcher
from hermes.tools.web.search import SEARCH_BACKENDS, SearchCall
from hermes.tools.web import DEFAULT_CHAR_LIMIT  # one value for the schema and the tool
from hermes.tools.web.settings import WebSettings, chosen_extract, chosen_search

log = logging.getLogger(__name__)

DEFAULT_LIMIT, MAX_LIMIT = 5, 100
CACHE_DIR = "web_cache"


# --------------------------------------------------------------------------- shared clients


def _backend_client(ctx: Any) -> httpx.Client:
    return ctx.shared.get("web.backend_client", lambda: httpx.Client(
        headers={"User-Agent": ctx.settings.user_agent}, timeout=ctx.settings.timeout))


def _fetcher(ctx: Any) -> GuardedFetcher:
    s = ctx.settings
    name = f"web.fetcher:{ctx.net!r}:{s.timeout}:{s.max_bytes}:{s.max_redirects}:{s.retries}:{s.max_retry_wait}:{s.user_agent}"
    return ctx.shared.get(name, lambda: GuardedFetcher(
        ctx.net, user_agent=s.user_agent, timeout=s.timeout, max_bytes=s.max_bytes, max_redirects=s.max_redirects,
        retries=s.retries, max_retry_wait=s.max_retry_wait))


# --------------------------------------------------------------------------- web_search


def run_search(ctx: Any, args: dict) -> dict:
    settings = ctx.settings or WebSettings()
    query = str(args["query"]).strip()
    if not query:
        return {"success": False, "error": "query is empty"}
    limit = max(1, min(MAX_LIMIT, int(args.get("limit") or DEFAULT_LIMIT)))
    backend, why = chosen_search(settings, ctx.secret)
    if backend is None:
        return {"success": False, "error": f"web_search is not available here: {why}"}
    try:
        hits = SEARCH_BACKENDS[backend](SearchCall(_backend_client(ctx), settings, ctx.secret), query, limit)
    except BackendError as e:
        return {"success": False, "error": f"search failed: {e}"}
    return {"success": True, "data": {"web": [{**hit, "position": i} for i, hit in enumerate(hits, 1)]}}


# --------------------------------------------------------------------------- web_extract


def _wanted_urls(raw: Any) -> tuple[list[str], str | None]:
    """The URLs asked for: strings, or search results ({"url": ...}) as the model may pass them back."""
    items = raw if isinstance(raw, list) else [raw]
    urls = []
    for item in items:
        url = item.get("url") if isinstance(item, dict) else item
        if not isinstance(url, str) or not url.strip():
            return [], f"urls must be URL strings or objects with a 'url', got {json.dumps(item)[:80]}"
        if url.strip() not in urls:
            urls.append(url.strip())
    return urls, None if urls else "urls is empty"


def truncate(content: str, limit: int) -> str:
    """Keep the head and the tail of a page over the limit, and say what was cut."""
    if len(content) <= limit:
        return content
    head = int(limit * 0.8)
    tail = limit - head
    omitted = len(content) - head - tail
    return (f"{content[:head]}\n\n[... {omitted} characters omitted ...]\n\n{content[-tail:] if tail else ''}"
            f"\n\n[Content truncated: {len(content)} characters, showing the first {head} and the last {tail}. "
            f"Call web_extract with a larger char_limit for more.]")


class PageCache:
    """Extracted pages of this run, one JSON file each under the run folder (None outside runs: no cache)."""

    def __init__(self, run_dir: Path | None, backend: str, fmt: str):
        self.dir = Path(run_dir) / CACHE_DIR if run_dir else None
        self.backend, self.fmt = backend, fmt

    def _path(self, url: str) -> Path:
        assert self.dir is not None
        return self.dir / (hashlib.sha256(f"{self.backend}\n{self.fmt}\n{url}".encode()).hexdigest()[:40] + ".json")

    def get(self, url: str) -> dict | None:
        if self.dir is None:
            return None
        try:
            cached = json.loads(self._path(url).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return cached if isinstance(cached, dict) and cached.get("requested") == url else None

    def put(self, url: str, result: dict) -> None:
        if self.dir is None or result.get("error"):
            return  # failures are tried again: the page may be back
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({**result, "requested": url}, f, ensure_ascii=False)
        os.replace(tmp, self._path(url))  # whole or absent: a crash never leaves half a page


def run_extract(ctx: Any, args: dict) -> dict:
    settings = ctx.settings or WebSettings()
    urls, problem = _wanted_urls(args["urls"])
    if problem:
        return {"error": problem}
    if len(urls) > settings.max_urls:
        return {"error": f"at most {settings.max_urls} URLs per call, got {len(urls)}"}
    char_limit = max(100, int(args.get("char_limit") or DEFAULT_CHAR_LIMIT))
    backend, why = chosen_extract(settings, ctx.secret)
    if backend is None:
        return {"error": f"web_extract is not available here: {why}"}

    results: dict[str, dict] = {}
    for url in urls:  # the policy first, whoever fetches: secrets in URLs never leave, file:// is never read
        try:
            ctx.net.check(url, resolve=False)
        except UrlRefused as e:
            results[url] = page(url, error=str(e))
    cache = PageCache(ctx.run_dir if settings.cache else None, backend, settings.output_format)
    for url in urls:
        if url not in results and (hit := cache.get(url)) is not None:
            results[url] = {k: hit.get(k) for k in ("url", "title", "content", "error")}
    todo = [u for u in urls if u not in results]
    if todo:
        call = ExtractCall(_backend_client(ctx), lambda: _fetcher(ctx), settings, ctx.secret, ctx.net)
        try:
            fetched = EXTRACT_BACKENDS[backend](call, todo)
        except BackendError as e:
            fetched = [page(u, error=f"extract failed: {e}") for u in todo]
        for url, result in zip(todo, fetched):
            cache.put(url, result)
            results[url] = result
    out = []
    for url in urls:
        r = results[url]
        out.append({"url": r.get("url") or url, "title": r.get("title") or "",
                    "content": truncate(r.get("content") or "", char_limit), "error": r.get("error")})
    body: dict[str, Any] = {"results": out}
    if all(r["error"] for r in out):  # nothing came back: the call failed, as the statistics should count it
        body["error"] = "; ".join(r["error"] for r in out)
    return body
