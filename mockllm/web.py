"""The web part of the default scenario: web_search for the task, then web_extract of the top results.

The extract turn reads the URLs out of the search result already in the conversation, as a
model would; when the search found nothing (or failed) there is no extract turn.
"""
from __future__ import annotations

import json
from typing import Any

from mockllm.conversation import Conversation, MockConfig, text_of

SEARCH_LIMIT = 3
EXTRACT_TOP = 2


def web_query(conv: Conversation) -> str:
    return " ".join(conv.first_user.split())[:100] or "hermes"


def search_urls(messages: list[dict]) -> list[str]:
    """The URLs of the latest web_search result in the conversation."""
    search_ids = {str(call.get("id")) for m in messages if m.get("role") == "assistant"
                  for call in m.get("tool_calls") or []
                  if isinstance(call, dict) and (call.get("function") or {}).get("name") == "web_search"}
    for message in reversed(messages):
        if message.get("role") == "tool" and str(message.get("tool_call_id")) in search_ids:
            try:
                body: Any = json.loads(text_of(message.get("content")))
            except ValueError:
                return []
            hits = ((body.get("data") or {}).get("web") or []) if isinstance(body, dict) else []
            return [h["url"] for h in hits if isinstance(h, dict) and isinstance(h.get("url"), str)]
    return []


def web_search_then_extract(conv: Conversation, config: MockConfig) -> list[list[tuple[str, dict]]]:
    if "web_search" not in conv.offered_tools:
        return []
    turns = [[("web_search", {"query": web_query(conv), "limit": SEARCH_LIMIT})]]
    urls = search_urls(conv.messages)[:EXTRACT_TOP] if "web_extract" in conv.offered_tools else []
    if urls:
        turns.append([("web_extract", {"urls": urls})])
    return turns


def web_fact(name: str, args: dict, output: str) -> str | None:
    if name == "web_search":
        return f"searched={args.get('query', '')[:40]!r}"
    if name == "web_extract":
        return f"extracted={len(args.get('urls') or [])} page(s)"
    return None
