"""The web toolset's settings and which backends they (and the keys that are set) select.

Fields become CLI flags --web_<field> and a section of the Prefect form; environment defaults
are read when the settings are made. API keys are never fields: they come from ctx.secret
(the environment, or a Prefect Secret block), so Prefect never stores them.

    auto search:  SEARXNG_URL -> searxng, else BRAVE_API_KEY -> brave, TAVILY_API_KEY -> tavily, EXA_API_KEY -> exa
    auto extract: FIRECRAWL_API_KEY -> firecrawl, TAVILY_API_KEY -> tavily, EXA_API_KEY -> exa,
                  else the built-in fetch when some search backend is configured (SEARXNG_URL and
                  nothing else: SearXNG + built-in, no key at all)
"""
from __future__ import annotations

import os
from typing import Callable, Literal

from pydantic import BaseModel, Field, field_validator

from hermes.environment import read

SearchBackend = Literal["auto", "searxng", "brave", "tavily", "exa", "none"]
ExtractBackend = Literal["auto", "builtin", "firecrawl", "tavily", "exa", "none"]
SEARCH_ORDER = ("searxng", "brave", "tavily", "exa")
EXTRACT_ORDER = ("firecrawl", "tavily", "exa")
KEYS = {"brave": "BRAVE_API_KEY", "tavily": "TAVILY_API_KEY", "exa": "EXA_API_KEY", "firecrawl": "FIRECRAWL_API_KEY"}
USER_AGENT = "hermes-batch/0.1 (an LLM agent's web_extract tool; fetches one page per request)"


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name) or default


class WebSettings(BaseModel):
    search_backend: SearchBackend = Field(
        default_factory=lambda: read("web_search_backend"),
        description="web_search backend: auto (by what is configured), searxng, brave, tavily, exa or none "
                    "(default: $HERMES_WEB_SEARCH_BACKEND, else auto)")
    extract_backend: ExtractBackend = Field(
        default_factory=lambda: read("web_extract_backend"),
        description="web_extract backend: auto, builtin (fetch the page here), firecrawl, tavily, exa or none "
                    "(default: $HERMES_WEB_EXTRACT_BACKEND, else auto)")
    searxng_url: str | None = Field(
        default_factory=lambda: _env("SEARXNG_URL"),
        description="base URL of a SearXNG instance with the JSON format enabled (default: $SEARXNG_URL)")
    brave_base_url: str = Field(default_factory=lambda: _env("BRAVE_API_URL", "https://api.search.brave.com/res/v1"),
                                description="Brave Search API base URL (default: $BRAVE_API_URL or Brave's)")
    tavily_base_url: str = Field(default_factory=lambda: _env("TAVILY_API_URL", "https://api.tavily.com"),
                                 description="Tavily API base URL (default: $TAVILY_API_URL or Tavily's)")
    exa_base_url: str = Field(default_factory=lambda: _env("EXA_API_URL", "https://api.exa.ai"),
                              description="Exa API base URL (default: $EXA_API_URL or Exa's)")
    firecrawl_base_url: str = Field(default_factory=lambda: _env("FIRECRAWL_API_URL", "https://api.firecrawl.dev"),
                                    description="Firecrawl API base URL, e.g. a self-hosted one (default: $FIRECRAWL_API_URL or Firecrawl's)")
    output_format: Literal["markdown", "text"] = Field("markdown", description="what web_extract returns pages as")
    timeout: float = Field(20.0, gt=0, le=300, description="seconds a page fetch or backend request may take")
    max_bytes: int = Field(2_000_000, gt=0, description="bytes of a page the built-in fetch reads at most")
    max_redirects: int = Field(5, ge=0, le=20, description="redirects the built-in fetch follows at most")
    max_urls: int = Field(5, gt=0, le=50, description="URLs one web_extract call may ask for")
    retries: int = Field(3, ge=0, le=10, description="retries of a rate-limited request (429, or 503 with Retry-After)")
    max_retry_wait: float = Field(30.0, ge=0, description="longest wait before a retry, whatever Retry-After says")
    cache: bool = Field(True, description="keep extracted pages in the run folder, so a resumed run does not fetch a URL twice")
    user_agent: str = Field(USER_AGENT, description="User-Agent of the built-in fetch")

    @field_validator("searxng_url", mode="before")
    @classmethod
    def _blank_is_unset(cls, v):
        return v or None


def chosen_search(settings: WebSettings, secret: Callable[[str], str | None]) -> tuple[str | None, str | None]:
    """(backend or None, why not) for web_search."""
    wanted = settings.search_backend
    if wanted == "none":
        return None, "web_search backend set to none"
    if wanted == "auto":
        for name in SEARCH_ORDER:
            if (settings.searxng_url if name == "searxng" else secret(KEYS[name])):
                return name, None
        return None, "no search backend configured (set SEARXNG_URL, BRAVE_API_KEY, TAVILY_API_KEY or EXA_API_KEY)"
    if wanted == "searxng":
        return ("searxng", None) if settings.searxng_url else (None, "search backend searxng needs SEARXNG_URL (--web_searxng_url)")
    return (wanted, None) if secret(KEYS[wanted]) else (None, f"search backend {wanted} needs {KEYS[wanted]}")


def chosen_extract(settings: WebSettings, secret: Callable[[str], str | None]) -> tuple[str | None, str | None]:
    """(backend or None, why not) for web_extract."""
    wanted = settings.extract_backend
    if wanted == "none":
        return None, "web_extract backend set to none"
    if wanted == "builtin":
        return "builtin", None
    if wanted == "auto":
        for name in EXTRACT_ORDER:
            if secret(KEYS[name]):
                return name, None
        if chosen_search(settings, secret)[0]:
            return "builtin", None
        return None, "no extract backend configured (set FIRECRAWL_API_KEY, TAVILY_API_KEY or EXA_API_KEY, or --web_extract_backend builtin)"
    return (wanted, None) if secret(KEYS[wanted]) else (None, f"extract backend {wanted} needs {KEYS[wanted]}")


def unavailable_reason(settings: WebSettings | None, secret: Callable[[str], str | None]) -> str | None:
    """None when web_search or web_extract has a backend here, else both reasons."""
    settings = settings or WebSettings()
    (search, why_search), (extract, why_extract) = chosen_search(settings, secret), chosen_extract(settings, secret)
    if search or extract:
        return None
    return f"{why_search}; {why_extract}"
