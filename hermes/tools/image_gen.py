"""The image_gen toolset: image_generate, through OpenAI's images API or FAL.

Backends (--image_backend): `openai` -- any endpoint speaking OpenAI's images API
(/v1/images/generations, and /v1/images/edits when an image to edit is given), by default the
run's own --base_url and key (--image_base_url, --image_model, HERMES_IMAGE_API_KEY override);
`fal` -- FAL's synchronous API (https://fal.run/<model>, key FAL_KEY); `auto` (default) is fal
when FAL_KEY is set and no image endpoint is configured, else openai.

Every image is saved in the run folder as images/<prompt key>-<call id>.<ext>, written whole
(temp file, then rename) and recorded in the journal entry (hermes.files); the tool result's
`image` names that file, which vision_analyze and image_generate's own `image_url` accept in the
same prompt. The first image_generate of a prompt attempt removes the files an earlier,
unfinished attempt of the same prompt left (killed mid-way, or failed), so the run folder holds
exactly the images of the kept entries. Usage (tokens where the backend says, images always) is
counted as "image_gen" (hermes.aux_usage).
"""
from __future__ import annotations

import base64
from typing import Any, Literal

# at load, not in the tool's call: see hermes/tools/vision.py
import httpx
from pydantic import BaseModel, Field

from hermes.errors import HermesError
from hermes.environment import read
from hermes.lazyimport import imported
from hermes.tools import images
from hermes.tools._common import dumps
from hermes.tools.registry import Tool, Toolset, register
from hermes.tools.vision import _message, endpoint_of, http_client, openai_client

ASPECTS = ("landscape", "square", "portrait")
FAL_SIZES = {"landscape": "landscape_16_9", "square": "square_hd", "portrait": "portrait_16_9"}

PARAMETERS = {
    "type": "object",
    "properties": {
        "prompt": {"type": "string", "description": "What the image should show, in detail"},
        "aspect_ratio": {"type": "string", "enum": list(ASPECTS), "default": "landscape",
                         "description": "Shape of the image (default landscape)"},
        "image_url": {"type": "string", "description": "An image to edit instead of starting from nothing: a URL, "
                      "a data URL, a file in your sandbox, or an `image` an earlier image_generate returned"},
        "reference_image_urls": {"type": "array", "items": {"type": "string"},
                                 "description": "Further images to take style or content from (same forms as image_url)"},
    },
    "required": ["prompt"],
}


class ImageGenSettings(BaseModel):
    backend: Literal["auto", "openai", "fal"] = Field(
        "auto", description="openai: an OpenAI images API endpoint; fal: FAL (key $FAL_KEY); "
                            "auto: fal when FAL_KEY is set and no --image_base_url is given, else openai")
    base_url: str = Field(default_factory=lambda: read("image_base_url"),
                          description="OpenAI images API endpoint (default: $HERMES_IMAGE_BASE_URL, else the run's "
                                      "own --base_url); its key is $HERMES_IMAGE_API_KEY")
    model: str = Field(default_factory=lambda: read("image_model"),
                       description="image model (default: $HERMES_IMAGE_MODEL, else gpt-image-1, or on FAL "
                                   "fal-ai/flux/schnell)")
    response_format: Literal["auto", "b64_json", "url"] = Field(
        "auto", description="OpenAI response_format to ask for (auto: do not send it; gpt-image models always "
                            "answer b64_json)")
    size_landscape: str = Field("1536x1024", description="OpenAI size of a landscape image")
    size_square: str = Field("1024x1024", description="OpenAI size of a square image")
    size_portrait: str = Field("1024x1536", description="OpenAI size of a portrait image")
    fal_base_url: str = Field("https://fal.run", description="FAL's synchronous endpoint")
    fal_edit_model: str = Field("fal-ai/flux/dev/image-to-image", description="FAL model used when image_url is given")
    timeout: float = Field(300.0, gt=0, description="seconds allowed for one generation")
    max_image_bytes: int = Field(50 << 20, gt=0, description="largest image accepted (generated or given), in bytes")


def backend_of(s: ImageGenSettings, secret) -> str:
    if s.backend != "auto":
        return s.backend
    return "fal" if secret("FAL_KEY") and not s.base_url else "openai"


def available(s: ImageGenSettings | None, secret) -> str | None:
    s = s or ImageGenSettings()
    if backend_of(s, secret) == "fal" and not secret("FAL_KEY"):
        return "--image_backend fal needs FAL_KEY (environment or Prefect Secret block)"
    return None


class BackendError(HermesError):
    def __init__(self, message: str, error_type: str = "backend_error"):
        super().__init__(message)
        self.error_type = error_type


def failed(message: str, error_type: str) -> str:
    return dumps({"success": False, "image": None, "modality": "text", "error": message, "error_type": error_type})


def run_image_generate(ctx: Any, args: dict) -> str:
    s: ImageGenSettings = ctx.settings or ImageGenSettings()
    aspect = args.get("aspect_ratio") or "landscape"
    try:
        refs = [args["image_url"]] if args.get("image_url") else []
        refs += [u for u in args.get("reference_image_urls") or [] if isinstance(u, str) and u.strip()]
        inputs = [images.load(ctx, ref, max_bytes=s.max_image_bytes, timeout=s.timeout, http=lambda: http_client(ctx))
                  for ref in refs]
    except images.ImageError as e:
        return failed(str(e), "invalid_image")
    try:
        if backend_of(s, ctx.secret) == "fal":
            data, extra = _fal(ctx, s, args["prompt"], aspect, inputs)
        else:
            data, extra = _openai(ctx, s, args["prompt"], aspect, inputs)
        image = images.as_image(data, "the generated image", s.max_image_bytes)
    except BackendError as e:
        return failed(str(e), e.error_type)
    except images.ImageError as e:
        return failed(f"the backend's answer is unusable: {e}", "invalid_response")
    shown = _save(ctx, image)
    return dumps({"success": True, "image": shown, "modality": "image", "error": None, "error_type": None,
                  "width": image.width, "height": image.height, **extra})


# --------------------------------------------------------------------------- backends

def _openai(ctx: Any, s: ImageGenSettings, prompt: str, aspect: str, inputs: list[images.Image]) -> tuple[bytes, dict]:
    base_url, _, key = endpoint_of(ctx, s.base_url, "x", "HERMES_IMAGE_API_KEY")
    if not base_url:
        raise BackendError("no image endpoint is configured: set --image_base_url (HERMES_IMAGE_BASE_URL)", "not_configured")
    client = openai_client(ctx, "image", base_url, key, s.timeout)
    openai = imported("openai")
    kw: dict[str, Any] = {"model": s.model or "gpt-image-1", "prompt": prompt, "n": 1,
                          "size": getattr(s, f"size_{aspect}")}
    if s.response_format != "auto":
        kw["response_format"] = s.response_format
    try:
        if inputs:
            files = [(f"image{i}{images.EXT[im.format]}", im.data, im.mime) for i, im in enumerate(inputs)]
            response = client.images.edit(image=files if len(files) > 1 else files[0], **kw)
        else:
            response = client.images.generate(**kw)
    except openai.APIStatusError as e:
        ctx.record_usage("image_gen", {"failed": 1})  # a call made, an image not had
        raise BackendError(f"the image endpoint answered HTTP {e.status_code}: {_message(e)}",
                           "content_policy" if e.status_code == 400 and "safety" in _message(e).lower() else "backend_error")
    except openai.APIError as e:
        raise BackendError(f"the image endpoint could not be reached: {type(e).__name__}: {e}", "unreachable")
    usage = response.usage.model_dump() if getattr(response, "usage", None) is not None else {}
    ctx.record_usage("image_gen", {**usage, "images": 1})
    if not response.data:
        raise BackendError("the image endpoint returned no image", "invalid_response")
    item = response.data[0]
    extra = {"revised_prompt": item.revised_prompt} if getattr(item, "revised_prompt", None) else {}
    if item.b64_json:
        return _b64(item.b64_json), extra
    if item.url:
        return _download(ctx, s, item.url), extra
    raise BackendError("the image endpoint's answer holds neither b64_json nor url", "invalid_response")


def _fal(ctx: Any, s: ImageGenSettings, prompt: str, aspect: str, inputs: list[images.Image]) -> tuple[bytes, dict]:
    """FAL's synchronous run: POST {fal_base_url}/{model} with `Authorization: Key ...`; the answer is
    {"images": [{"url", "width", "height", "content_type"}], "seed", "has_nsfw_concepts", ...}."""
    model = (s.fal_edit_model if inputs else s.model) or "fal-ai/flux/schnell"
    body: dict[str, Any] = {"prompt": prompt, "image_size": FAL_SIZES[aspect], "num_images": 1}
    if inputs:  # FAL takes files as data URIs
        body["image_url"] = inputs[0].data_url()
        body["image_urls"] = [im.data_url() for im in inputs]
    try:
        r = http_client(ctx).post(f"{s.fal_base_url.rstrip('/')}/{model.strip('/')}", json=body, timeout=s.timeout,
                                  headers={"Authorization": f"Key {ctx.secret('FAL_KEY') or ''}"})
    except httpx.HTTPError as e:
        raise BackendError(f"FAL could not be reached: {type(e).__name__}: {e}", "unreachable")
    ctx.record_usage("image_gen", {"images": 1} if r.status_code == 200 else {"failed": 1})
    if r.status_code != 200:
        detail = r.text[:500]
        raise BackendError(f"FAL answered HTTP {r.status_code}: {detail}",
                           "auth_error" if r.status_code in (401, 403) else "backend_error")
    try:
        answer = r.json()
        first = answer["images"][0]
        url = first["url"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise BackendError(f"FAL's answer holds no image: {r.text[:300]}", "invalid_response")
    extra = {"seed": answer["seed"]} if isinstance(answer.get("seed"), int) else {}
    if any(answer.get("has_nsfw_concepts") or []):
        extra["nsfw_flagged"] = True
    if url.startswith("data:"):  # sync_mode answers carry the image inline
        return images.from_data_url(url, s.max_image_bytes).data, extra
    return _download(ctx, s, url), extra


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as e:
        raise BackendError(f"the image endpoint's b64_json does not decode: {e}", "invalid_response")


def _download(ctx: Any, s: ImageGenSettings, url: str) -> bytes:
    """The image at a URL the backend (not the model) gave: trusted like the backend, still capped."""
    try:
        with http_client(ctx).stream("GET", url, timeout=s.timeout, follow_redirects=True) as r:
            if r.status_code != 200:
                raise BackendError(f"fetching the generated image answered HTTP {r.status_code}", "invalid_response")
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > s.max_image_bytes:
                    raise BackendError(f"the generated image is over {s.max_image_bytes} bytes", "invalid_response")
            return bytes(body)
    except httpx.HTTPError as e:
        raise BackendError(f"fetching the generated image failed: {type(e).__name__}: {e}", "unreachable")


def _save(ctx: Any, image: images.Image) -> str:
    return images.save(ctx, image.data, images.EXT[image.format])  # images/<key>-<call>.png


register(Toolset(
    name="image_gen", flag_prefix="image", settings=ImageGenSettings, needs_sandbox=False, available=available,
    description="image_generate: OpenAI images API (default: the run's own endpoint) or FAL",
    tools=[Tool(name="image_generate", run=run_image_generate, parameters=PARAMETERS,
                description="Generate an image from a text prompt, or edit an image (image_url) taking further "
                            "reference images into account. Returns the saved image's name in `image`, which "
                            "vision_analyze can look at.")]))
