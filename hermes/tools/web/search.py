"""Search backends: each turns (query, limit) into [{"title", "url", "description"}] from its provider's API.

    SearXNG  GET  {SEARXNG_URL}/search?q=...&format=json          (self-hosted, no key; JSON format enabled)
    Brave    GET  {base}/web/search?q=...&count=N, X-Subscription-Token: BRAVE_API_KEY
    Tavily   POST {base}/search {"query", "max_results"}, Authorization: Bearer TAVILY_API_KEY
    Exa      POST {base}/search {"query", "numResults"}, x-api-key: EXA_API_KEY
"""
from __future__ import annotations

from typing import Any, Callable

import httpx

from hermes.tools.web.http import BackendError, backend_request

SEARCH_KEYS = {"brave": "BRAVE_API_KEY", "tavily": "TAVILY_API_KEY", "exa": "EXA_API_KEY"}
BRAVE_MAX = 20  # Brave's count parameter stops at 20


class SearchCall:
    """What a search backend needs: the shared client, the web settings, the secret lookup."""

    def __init__(self, client: httpx.Client, settings: Any, secret: Callable[[str], str | None]):
        self.client, self.settings, self.secret = client, settings, secret

    def request(self, name: str, method: str, url: str, **kw: Any) -> Any:
        return backend_request(self.client, name, method, url, retries=self.settings.retries,
                               max_wait=self.settings.max_retry_wait, timeout=self.settings.timeout, **kw)

    def key(self, backend: str) -> str:
        value = self.secret(SEARCH_KEYS[backend])
        if not value:
            raise BackendError(f"{SEARCH_KEYS[backend]} is not set")
        return value


def _hit(title: Any, url: Any, description: Any) -> dict | None:
    if not isinstance(url, str) or not url:
        return None
    return {"title": str(title or url), "url": url, "description": str(description or "")}


def _results(body: Any, name: str, *path: str) -> list:
    for key in path:
        body = body.get(key) if isinstance(body, dict) else None
    if not isinstance(body, list):
        raise BackendError(f"{name} answered without a result list")
    return body


def searxng(call: SearchCall, query: str, limit: int) -> list[dict]:
    base = (call.settings.searxng_url or "").rstrip("/")
    body = call.request("SearXNG", "GET", f"{base}/search", params={"q": query, "format": "json"},
                        headers={"Accept": "application/json"})
    hits = (_hit(r.get("title"), r.get("url"), r.get("content")) for r in _results(body, "SearXNG", "results")
            if isinstance(r, dict))
    return [h for h in hits if h][:limit]


def brave(call: SearchCall, query: str, limit: int) -> list[dict]:
    body = call.request("Brave Search", "GET", f"{call.settings.brave_base_url.rstrip('/')}/web/search",
                        params={"q": query, "count": min(limit, BRAVE_MAX)},
                        headers={"Accept": "application/json", "X-Subscription-Token": call.key("brave")})
    if isinstance(body, dict) and "web" not in body:
        return []  # Brave leaves out "web" when nothing matched
    hits = (_hit(r.get("title"), r.get("url"), r.get("description")) for r in _results(body, "Brave Search", "web", "results")
            if isinstance(r, dict))
    return [h for h in hits if h][:limit]


def tavily(call: SearchCall, query: str, limit: int) -> list[dict]:
    body = call.request("Tavily", "POST", f"{call.settings.tavily_base_url.rstrip('/')}/search",
                        json={"query": query, "max_results": min(limit, 20), "search_depth": "basic"},
                        headers={"Authorization": f"Bearer {call.key('tavily')}"})
    hits = (_hit(r.get("title"), r.get("url"), r.get("content")) for r in _results(body, "Tavily", "results")
            if isinstance(r, dict))
    return [h for h in hits if h][:limit]


def exa(call: SearchCall, query: str, limit: int) -> list[dict]:
    body = call.request("Exa", "POST", f"{call.settings.exa_base_url.rstrip('/')}/search",
                        json={"query": query, "numResults": min(limit, 100), "type": "auto",
                              "contents": {"highlights": {"numSentences": 2}}},
                        headers={"x-api-key": call.key("exa")})
    hits = []
    for r in _results(body, "Exa", "results"):
        if isinstance(r, dict):
            highlights = r.get("highlights") if isinstance(r.get("highlights"), list) else []
            description = " ".join(str(h) for h in highlights) or r.get("summary") or (r.get("text") or "")[:300]
            hits.append(_hit(r.get("title"), r.get("url"), description))
    return [h for h in hits if h][:limit]


SEARCH_BACKENDS: dict[str, Callable[[SearchCall, str, int], list[dict]]] = {
    "searxng": searxng, "brave": brave, "tavily": tavily, "exa": exa}
