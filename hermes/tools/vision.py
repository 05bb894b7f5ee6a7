"""The vision toolset: vision_analyze, an auxiliary vision model looking at an image for the agent.

The backend is any OpenAI-compatible chat endpoint that takes image parts; by default the run's
own (--base_url, --model and its key), else --vision_base_url / --vision_model
(HERMES_VISION_BASE_URL / HERMES_VISION_MODEL) with the key HERMES_VISION_API_KEY. The image
(hermes.tools.images: an http(s) URL, a data URL, a file of the prompt's sandbox, or what
image_generate returned) is read here and sent inline, so the vision endpoint never needs to
reach the model's URLs itself. Each call's token usage is counted as "vision" (hermes.aux_usage).
"""
from __future__ import annotations

import hashlib
from typing import Any

# Imported here, not in the tool's call: a prompt's parallel tool calls would each import it
# first in threads of their own, and a module half-initialised by one ('partially initialized
# module httpx has no attribute URL') failed the other's call. The openai SDK, 0.7 s of every
# run's start, is imported on first use under hermes.lazyimport's lock instead.
import httpx
from pydantic import BaseModel, Field

from hermes.environment import read
from hermes.lazyimport import imported
from hermes.tools import images
from hermes.tools._common import dumps
from hermes.tools.registry import Tool, Toolset, register

PARAMETERS = {
    "type": "object",
    "properties": {
        "image_url": {"type": "string", "description": "The image: an http(s) URL, a data:image/... URL, a path of a "
                      "file in your sandbox (e.g. a chart you just plotted), or the `image` image_generate returned"},
        "question": {"type": "string", "description": "What to find out about the image (describe it, read its text, "
                     "check a detail...)"},
    },
    "required": ["image_url", "question"],
}


class VisionSettings(BaseModel):
    base_url: str = Field(default_factory=lambda: read("vision_base_url"),
                          description="OpenAI-compatible endpoint of the vision model (default: $HERMES_VISION_BASE_URL, "
                                      "else the run's own --base_url); its key is $HERMES_VISION_API_KEY")
    model: str = Field(default_factory=lambda: read("vision_model"),
                       description="vision model name (default: $HERMES_VISION_MODEL, else the run's own --model)")
    max_image_bytes: int = Field(20 << 20, gt=0, description="largest image accepted, in bytes")
    fetch_timeout: float = Field(30.0, gt=0, description="seconds allowed to fetch an image URL")
    timeout: float = Field(120.0, gt=0, description="seconds allowed for one vision model call")
    max_tokens: int = Field(1500, gt=0, description="most tokens of one analysis")


def endpoint_of(ctx: Any, base_url: str, model: str, key_name: str) -> tuple[str, str, str]:
    """(base_url, model, api_key) of an auxiliary model: its own settings, else the run's endpoint.

    The run's key goes only to the run's own endpoint: a separately configured endpoint gets its
    own key (or none), never the agent's."""
    own = ctx.endpoint
    url = base_url or (own.base_url if own else "")
    name = model or (own.model if own else "")
    key = ctx.secret(key_name)
    if not key and own and url.rstrip("/") == own.base_url.rstrip("/"):
        key = own.api_key
    return url, name, key or "not-needed"


def openai_client(ctx: Any, kind: str, base_url: str, api_key: str, timeout: float) -> Any:
    """One SDK client per (endpoint, key) for the whole run (ctx.shared closes it at the end)."""
    tag = hashlib.sha256(api_key.encode()).hexdigest()[:12]
    openai = imported("openai")
    return ctx.shared.get(f"{kind}-openai:{base_url}:{tag}:{timeout}",
                          lambda: openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=2))


def http_client(ctx: Any):
    """The run's HTTP client for fetching model-named images (no proxies from the environment:
    the address checks must see the real peer)."""
    return ctx.shared.get("images-http", lambda: httpx.Client(trust_env=False, headers={"User-Agent": "hermes-batch"}))


NOT_CONFIGURED = ("no vision model is configured: set --vision_base_url and --vision_model "
                  "(HERMES_VISION_BASE_URL / HERMES_VISION_MODEL)")


def failed(message: str) -> dict:
    return {"success": False, "analysis": None, "error": message}


def vision_endpoint(ctx: Any, s: VisionSettings) -> tuple[str, str, str] | None:
    """(base_url, model, api_key) of the vision model, or None when none is configured."""
    base_url, model, key = endpoint_of(ctx, s.base_url, s.model, "HERMES_VISION_API_KEY")
    return (base_url, model, key) if base_url and model else None


def analyse(ctx: Any, image: images.Image, question: str, s: VisionSettings | None = None) -> dict:
    """Ask the vision model `question` about `image`: {"success": True, "analysis"} or a failure
    result. The call's token usage is counted as "vision". Other toolsets (browser_vision) call
    this with their own image and the vision toolset's settings."""
    s = s or VisionSettings()
    endpoint = vision_endpoint(ctx, s)
    if endpoint is None:
        return failed(NOT_CONFIGURED)
    base_url, model, key = endpoint
    client = openai_client(ctx, "vision", base_url, key, s.timeout)
    openai = imported("openai")
    try:
        response = client.chat.completions.create(
            model=model, max_tokens=s.max_tokens,
            messages=[{"role": "user", "content": [
                {"type": "text", "text": question},
                {"type": "image_url", "image_url": {"url": image.data_url()}}]}])
    except openai.APIStatusError as e:
        return failed(f"the vision model answered HTTP {e.status_code}: {_message(e)}")
    except openai.APIError as e:  # connection errors, time-outs
        return failed(f"the vision model could not be reached: {type(e).__name__}: {e}")
    if response.usage is not None:
        ctx.record_usage("vision", response.usage.model_dump())
    choice = response.choices[0] if response.choices else None
    analysis = (choice.message.content or "").strip() if choice else ""
    if not analysis:
        return failed("the vision model returned no analysis")
    return {"success": True, "analysis": analysis}


def run_vision_analyze(ctx: Any, args: dict) -> str:
    s: VisionSettings = ctx.settings or VisionSettings()
    if vision_endpoint(ctx, s) is None:  # said before any image is fetched
        return dumps(failed(NOT_CONFIGURED))
    try:
        image = images.load(ctx, args["image_url"], max_bytes=s.max_image_bytes, timeout=s.fetch_timeout,
                            http=lambda: http_client(ctx))
    except images.ImageError as e:
        return dumps(failed(str(e)))
    return dumps(analyse(ctx, image, args["question"], s))


def _message(e: Any) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:500]
    return str(e)[:500]


register(Toolset(
    name="vision", settings=VisionSettings, needs_sandbox=False,
    description="vision_analyze: an OpenAI-compatible vision model (default: the run's own endpoint)",
    tools=[Tool(name="vision_analyze", run=run_vision_analyze, parameters=PARAMETERS,
                description="Look at an image and answer a question about it: describe it, read the text in it, "
                            "check a chart or a generated picture. The image may be a URL, a data URL, a file in your "
                            "sandbox or an image image_generate made.")]))
