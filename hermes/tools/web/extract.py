"""Extract backends: each turns URLs into pages {"url", "title", "content", "error"}.

    builtin    the guarded fetch (hermes/tools/web/http.py), HTML turned into markdown or text by trafilatura
    Firecrawl  POST {base}/v1/scrape {"url", "formats": ["markdown"], "onlyMainContent": true}, Bearer FIRECRAWL_API_KEY
    Tavily     POST {base}/extract {"urls", "format": "markdown"}, Bearer TAVILY_API_KEY
    Exa        POST {base}/contents {"urls", "text": true}, x-api-key: EXA_API_KEY

trafilatura was chosen over markdownify / html2text / readability-lxml: it finds the main
content (drops navigation, footers, cookie banners) and writes markdown or text itself, in one
maintained package; markdownify converts everything, boilerplate included; html2text is GPL and
converts everything too; readability-lxml finds the article but leaves HTML to convert.
"""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import httpx

from hermes.lazyimport import imported
from hermes.netpolicy import NetPolicy, UrlRefused
from hermes.tools.web.http import BackendError, FetchError, GuardedFetcher, backend_request

EXTRACT_KEYS = {"firecrawl": "FIRECRAWL_API_KEY", "tavily": "TAVILY_API_KEY", "exa": "EXA_API_KEY"}
TEXT_TYPES = ("text/plain", "text/markdown", "application/json", "text/csv", "application/xml", "text/xml")
PARALLEL = 4


def page(url: str, title: str = "", content: str = "", error: str | None = None) -> dict:
    return {"url": url, "title": title, "content": content, "error": error}


class ExtractCall:
    """What an extract backend needs: HTTP clients, the web settings, secrets and the URL policy."""

    def __init__(self, client: httpx.Client, fetcher: Callable[[], GuardedFetcher], settings: Any,
                 secret: Callable[[str], str | None], policy: NetPolicy):
        self.client, self._fetcher, self.settings, self.secret, self.policy = client, fetcher, settings, secret, policy

    def request(self, name: str, method: str, url: str, **kw: Any) -> Any:
        return backend_request(self.client, name, method, url, retries=self.settings.retries,
                               max_wait=self.settings.max_retry_wait, timeout=max(self.settings.timeout, 60.0), **kw)

    def key(self, backend: str) -> str:
        value = self.secret(EXTRACT_KEYS[backend])
        if not value:
            raise BackendError(f"{EXTRACT_KEYS[backend]} is not set")
        return value

    @property
    def fetcher(self) -> GuardedFetcher:
        return self._fetcher()


def _each(urls: list[str], one: Callable[[str], dict]) -> list[dict]:
    if len(urls) == 1:
        return [one(urls[0])]
    with ThreadPoolExecutor(max_workers=min(PARALLEL, len(urls))) as pool:
        return list(pool.map(one, urls))


def first_heading(text: str) -> str:
    match = re.search(r"^#{1,3}\s+(.+)$", text or "", re.M)
    return match.group(1).strip() if match else ""


# --------------------------------------------------------------------------- built-in


def html_to_text(html: bytes | str, url: str, output_format: str) -> tuple[str, str]:
    """(title, main content as markdown or text) of an HTML page."""
    trafilatura = imported("trafilatura")  # on first use: it loads lxml and its models

    fmt = "markdown" if output_format == "markdown" else "txt"
    content = trafilatura.extract(html, url=url, output_format=fmt, include_links=fmt == "markdown",
                                  include_tables=True, include_comments=False, favor_recall=True)
    if not content:  # no main content found (a link list, a form): all visible text rather than nothing
        content = trafilatura.html2txt(html) or ""
    metadata = trafilatura.extract_metadata(html, default_url=url)
    title = (metadata.title if metadata and metadata.title else "") or first_heading(content)
    return title, content.strip()


def builtin_one(call: ExtractCall, url: str) -> dict:
    try:
        fetched = call.fetcher.fetch(url)
    except (UrlRefused, FetchError) as e:
        return page(url, error=str(e))
    kind = fetched.content_type.split(";", 1)[0].strip().lower()
    note = f"\n\n[The page was cut at {call.settings.max_bytes} bytes.]" if fetched.truncated else ""
    if kind in ("text/html", "application/xhtml+xml", "") or fetched.body.lstrip()[:15].lower().startswith((b"<!doctype", b"<html")):
        title, content = html_to_text(fetched.body, fetched.url, call.settings.output_format)
        return page(fetched.url, title, content + note)
    if kind.startswith("text/") or kind in TEXT_TYPES:
        text = fetched.body.decode(fetched.encoding or "utf-8", errors="replace")
        first_line = next((line.strip() for line in text.splitlines() if line.strip()), "")
        return page(fetched.url, first_heading(text) or (first_line if len(first_line) <= 120 else ""), text + note)
    return page(fetched.url, error=f"not a text page ({kind}); the built-in extractor reads HTML and text only")


def builtin(call: ExtractCall, urls: list[str]) -> list[dict]:
    return _each(urls, lambda u: builtin_one(call, u))


# --------------------------------------------------------------------------- hosted


def firecrawl(call: ExtractCall, urls: list[str]) -> list[dict]:
    key = call.key("firecrawl")
    endpoint = f"{call.settings.firecrawl_base_url.rstrip('/')}/v1/scrape"

    def one(url: str) -> dict:
        try:
            body = call.request("Firecrawl", "POST", endpoint, headers={"Authorization": f"Bearer {key}"},
                                json={"url": url, "formats": ["markdown"], "onlyMainContent": True})
        except BackendError as e:
            return page(url, error=str(e))
        if not isinstance(body, dict) or not body.get("success") or not isinstance(body.get("data"), dict):
            return page(url, error=f"Firecrawl could not scrape it: {(body or {}).get('error') or 'no data'}")
        data = body["data"]
        meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        markdown = data.get("markdown") or ""
        status = meta.get("statusCode")
        if isinstance(status, int) and status >= 400 and not markdown:
            return page(url, error=f"the page answered HTTP {status}")
        return page(meta.get("sourceURL") or url, meta.get("title") or first_heading(markdown), markdown)

    return _each(urls, one)


def tavily(call: ExtractCall, urls: list[str]) -> list[dict]:
    body = call.request("Tavily", "POST", f"{call.settings.tavily_base_url.rstrip('/')}/extract",
                        headers={"Authorization": f"Bearer {call.key('tavily')}"},
                        json={"urls": urls, "extract_depth": "basic", "format": call.settings.output_format})
    found = {r.get("url"): r for r in body.get("results") or [] if isinstance(r, dict)}
    failed = {r.get("url"): r for r in body.get("failed_results") or [] if isinstance(r, dict)}
    out = []
    for url in urls:
        if url in found:
            text = found[url].get("raw_content") or ""
            out.append(page(url, found[url].get("title") or first_heading(text), text))
        else:
            out.append(page(url, error=f"Tavily could not extract it: {(failed.get(url) or {}).get('error') or 'no result'}"))
    return out


def exa(call: ExtractCall, urls: list[str]) -> list[dict]:
    body = call.request("Exa", "POST", f"{call.settings.exa_base_url.rstrip('/')}/contents",
                        headers={"x-api-key": call.key("exa")}, json={"urls": urls, "text": True})
    found = {}
    for r in body.get("results") or []:
        if isinstance(r, dict):
            found[r.get("url")] = found[r.get("id")] = r
    statuses = {s.get("id"): s for s in body.get("statuses") or [] if isinstance(s, dict)}
    out = []
    for url in urls:
        status = statuses.get(url) or {}
        if status.get("status") == "error" or url not in found:
            err = status.get("error") or {}
            why = f"{err.get('tag', 'no result')}" + (f" (HTTP {err['httpStatusCode']})" if err.get("httpStatusCode") else "")
            out.append(page(url, error=f"Exa could not fetch it: {why}"))
        else:
            r = found[url]
            out.append(page(r.get("url") or url, r.get("title") or "", r.get("text") or ""))
    return out


EXTRACT_BACKENDS: dict[str, Callable[[ExtractCall, list[str]], list[dict]]] = {
    "builtin": builtin, "firecrawl": firecrawl, "tavily": tavily, "exa": exa}
