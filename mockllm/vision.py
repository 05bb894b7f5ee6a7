"""The vision and image_gen part of the default scenario, and the mock as a vision model.

As a vision model: a request whose last user message carries ``image_url`` parts is answered with
what the images are, read from their bytes (data URLs), so a test can prove the bytes arrived::

    The image is a PNG, 1024x1024 pixels, 5123 bytes, sha256 3f2a9c0d1b7e. Asked: What does it show?

As the agent's model, when offered the tools and while the conversation's ``--turns`` budget
lasts (the parts before this one spend it first):

* ``image_generate`` {"prompt": "a test card for conversation <k>", "aspect_ratio": "square"};
* ``vision_analyze`` on the ``image`` that call returned (or, with no image_generate offered or no
  image made, on a small PNG data URL of the mock's own), question "What does this image show?".

The final answer quotes ``image=<name>`` and ``analysis=<its first words>``.
"""
from __future__ import annotations

import base64
import json
import re

from mockllm.conversation import Conversation, MockConfig, Reply
from mockllm.images import describe, make_png

QUESTION = "What does this image show?"


def image_parts(message: dict) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    urls = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if isinstance(url, str):
                urls.append(url)
    return urls


def vision_reply(conv: Conversation) -> Reply | None:
    """The answer to a vision request (the last user message has images), else None."""
    users = [m for m in conv.messages if m["role"] == "user"]
    urls = image_parts(users[-1]) if users else []
    if not urls:
        return None
    seen = [_describe_url(url) for url in urls]
    question = " ".join(conv.first_user.split())[:200]
    return Reply(content=" ".join(seen) + (f" Asked: {question}" if question else ""))


def _describe_url(url: str) -> str:
    m = re.match(r"data:([^;,]*)(;base64)?,(.*)$", url, re.S)
    if not m:
        return f"The image is given by URL ({url[:100]}), which this mock does not fetch."
    try:
        data = base64.b64decode(m[3], validate=True) if m[2] else m[3].encode()
    except ValueError:
        return "The image's data URL does not decode."
    d = describe(data)
    size = f"{d['width']}x{d['height']} pixels, " if d["width"] else ""
    return f"The image is a {d['format']}, {size}{d['bytes']} bytes, sha256 {d['sha256'][:12]}."


def vision_and_images(conv: Conversation, config: MockConfig, budget: int) -> list[list[tuple[str, dict]]]:
    """At most `budget` turns: what the scenario's parts before this one left of config.turns."""
    offered, k = conv.offered_tools, conv.token
    steps: list[list[tuple[str, dict]]] = []
    if "image_generate" in offered:
        steps.append([("image_generate", {"prompt": f"a test card for conversation {k}", "aspect_ratio": "square"})])
    if "vision_analyze" in offered:
        image = generated_image(conv.messages) or _own_png(k)
        steps.append([("vision_analyze", {"image_url": image, "question": QUESTION})])
    return steps[:max(0, budget)]


def generated_image(messages: list[dict]) -> str | None:
    """The ``image`` of the last successful image_generate result in the conversation."""
    names = {}
    for message in messages:
        if message["role"] == "assistant":
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    names[str(call.get("id"))] = call["function"].get("name")
    found = None
    for message in messages:
        if message["role"] == "tool" and names.get(str(message.get("tool_call_id"))) == "image_generate":
            try:
                result = json.loads(message.get("content") or "")
            except (TypeError, ValueError):
                continue
            if isinstance(result, dict) and result.get("success") and isinstance(result.get("image"), str):
                found = result["image"]
    return found


def _own_png(k: str) -> str:
    return "data:image/png;base64," + base64.b64encode(make_png(32, 24, k, f"mock picture {k}")).decode("ascii")


def vision_fact(name: str, args: dict, output: str) -> str | None:
    if name == "image_generate":
        m = re.search(r'"image": "([^"]+)"', output)
        return f"image={m[1]}" if m else None
    if name == "vision_analyze":
        m = re.search(r'"analysis": "([^"]*)', output)
        return f"analysis={m[1]}" if m else None
    return None
