"""One look at the model endpoint before a run fans out: reachable, the key accepted, the model known.

Why: with a wrong --base_url (a closed port) 20 prompts took 6 min 58 s to end Failed, each
retried with backoff, and every one was journaled as a failure a resume had to redo (issue 44).
One request says what all of them would: a run whose endpoint cannot serve is refused in
seconds, before anything is journaled, so a resume owes everything.

How it decides, cheapest first:
1. GET {base_url}/models. No answer (refused, unknown host, time-out): refused. 401/403: the
   key is refused. The model among the listed ids: fine (its context length is read if listed).
2. GET {base_url}/models/{model} (OpenAI's retrieve-model): 200 means the server knows it.
3. Otherwise one completion of one token: servers such as llama.cpp serve any name they are
   given and list another, vLLM answers 404 for a model it does not serve. A 4xx other than
   408/409/429 refuses the run with the endpoint's own message; 429 and 5xx are a working
   endpoint's passing trouble, left to the run's retries and its breaker (hermes.model.breaker).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from hermes.errors import HermesError
from hermes.model.calls import status_text

log = logging.getLogger(__name__)
TIMEOUT = 15.0


class EndpointUnusable(HermesError, ValueError):
    """The endpoint cannot serve this run; the message says why and what to check."""

    kind = "model endpoint check failed"


@dataclass
class EndpointInfo:
    models: list[str]
    context_length: int | None = None  # as /models says, where it does (vLLM's max_model_len)


def check_endpoint(base_url: str, model: str, api_key: str, *, timeout: float = TIMEOUT) -> EndpointInfo:
    """Raise EndpointUnusable when the endpoint cannot serve `model`; else what /models said."""
    root = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}
    with httpx.Client(timeout=timeout, headers=headers, follow_redirects=True) as http:
        listing = _get(http, f"{root}/models", base_url)
        info = EndpointInfo(models=[])
        if listing.status_code in (401, 403):
            raise _refused(listing, base_url, "the endpoint refused the API key")
        if listing.status_code == 200:
            info = _listed(listing, model)
            if model in info.models:
                return info
        one = _get(http, f"{root}/models/{quote(model, safe='')}", base_url)
        if one.status_code == 200 and _json(one).get("id") == model:
            return info
        answer = _post(http, f"{root}/chat/completions", base_url, {
            "model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "Say OK."}]})
    if answer.status_code < 400:
        return info
    if answer.status_code in (401, 403):
        raise _refused(answer, base_url, "the endpoint refused the API key")
    if answer.status_code in (408, 409, 425, 429) or answer.status_code >= 500:
        log.warning("endpoint check: %s answered %d (%s); going on, the run's retries and breaker decide",
                    base_url, answer.status_code, status_text(answer.status_code, answer.content))
        return info
    listed = f" (it lists: {', '.join(info.models[:10])})" if info.models else ""
    raise _refused(answer, base_url, f"the endpoint cannot serve model '{model}'{listed}")


def _get(http: httpx.Client, url: str, base_url: str) -> httpx.Response:
    try:
        return http.get(url)
    except httpx.HTTPError as e:
        raise _unreachable(base_url, e) from None


def _post(http: httpx.Client, url: str, base_url: str, body: dict[str, Any]) -> httpx.Response:
    try:
        return http.post(url, json=body)
    except httpx.HTTPError as e:
        raise _unreachable(base_url, e) from None


def _unreachable(base_url: str, e: Exception) -> EndpointUnusable:
    what = "no answer in time" if isinstance(e, httpx.TimeoutException) else (str(e) or type(e).__name__)
    return EndpointUnusable(f"model endpoint check failed: cannot reach {base_url} ({what}). Check --base_url "
                            f"and that the server is up; --check_endpoint=false skips this check")


def _refused(resp: httpx.Response, base_url: str, what: str) -> EndpointUnusable:
    return EndpointUnusable(f"model endpoint check failed: {what}: {base_url} answered {resp.status_code}: "
                            f"{status_text(resp.status_code, resp.content)}. Nothing was run; "
                            f"--check_endpoint=false skips this check")


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = json.loads(resp.content)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _listed(resp: httpx.Response, model: str) -> EndpointInfo:
    data = _json(resp).get("data")
    entries = [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []
    info = EndpointInfo(models=[str(d.get("id")) for d in entries if d.get("id")])
    for d in entries:
        if d.get("id") == model:
            # vLLM: max_model_len; OpenRouter: context_length (llama.cpp's meta gives the training
            # context, not the server's --ctx-size: not taken)
            for value in (d.get("max_model_len"), d.get("context_length")):
                if isinstance(value, int) and value > 0:
                    info.context_length = value
                    break
    return info
