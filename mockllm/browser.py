"""The browser part of the default scenario: browse the first URL of the prompt like a user would.

Six turns (seven when offered browser_vision), one browser call each: navigate; type into the first text box of the page it got
back; click the first button (a form submitted); snapshot the page that led to; click the first
link of that snapshot (a second page reached); snapshot that; and, when offered browser_vision,
a seventh: ask about the page's screenshot (QUESTION). The refs come from the snapshot results the
mock got back, never guessed; when a page has no text box, button or link, that turn looks around
instead (snapshot, scroll, back), so the part always has the same turns and the parts after it
keep their place. A prompt without an http(s) URL gets no browser turns.
"""
from __future__ import annotations

import json
import re

from mockllm.conversation import Conversation, MockConfig, text_of

Turn = list[tuple[str, dict]]
URL = re.compile(r"https?://[^\s\"'<>()]+")
QUESTION = "What does the page look like?"
REF_LINE = re.compile(r"- (?P<role>[a-z]+)\b[^\n]*?\[ref=(?P<ref>@[a-z0-9]+)\]")


def refs_by_role(snapshot: str) -> dict[str, str]:
    """role -> the first ref of that role in a snapshot text (`- textbox "Name" [ref=@e6]`)."""
    found: dict[str, str] = {}
    for m in REF_LINE.finditer(snapshot or ""):
        found.setdefault(m["role"], m["ref"])
    return found


def browser_results(conv: Conversation) -> list[dict]:
    """The parsed results of the browser calls after the anchoring user message, in order."""
    names: dict[str, str] = {}
    results: list[dict] = []
    anchor = next((i for i in range(len(conv.messages) - 1, -1, -1) if conv.messages[i]["role"] == "user"
                   and text_of(conv.messages[i].get("content")) == conv.first_user), 0)
    for message in conv.messages[anchor:]:
        calls = (message.get("tool_calls") or []) if message["role"] == "assistant" else []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                names[str(call.get("id"))] = str(function.get("name"))
        if message["role"] == "tool" and names.get(str(message.get("tool_call_id")), "").startswith("browser_"):
            try:
                value = json.loads(text_of(message.get("content")))
            except json.JSONDecodeError:
                value = {}
            results.append(value if isinstance(value, dict) else {})
    return results


def browse(conv: Conversation, config: MockConfig) -> list[Turn]:
    if "browser_navigate" not in conv.offered_tools:
        return []
    found = URL.search(conv.first_user)
    if not found:
        return []
    url = found.group(0).rstrip(".,;:!?")
    results = browser_results(conv)
    first = refs_by_role(str(results[0].get("snapshot", ""))) if results else {}
    textbox = first.get("textbox") or first.get("searchbox")
    button = first.get("button")
    later = refs_by_role(str(results[3].get("snapshot", ""))) if len(results) > 3 else {}
    link = later.get("link")
    return [
        [("browser_navigate", {"url": url})],
        [("browser_type", {"ref": textbox, "text": f"hermes-{conv.token}"})] if textbox else [("browser_snapshot", {})],
        [("browser_click", {"ref": button})] if button else [("browser_scroll", {"direction": "down"})],
        [("browser_snapshot", {})],
        [("browser_click", {"ref": link})] if link else [("browser_back", {})],
        [("browser_snapshot", {})],
        *([[("browser_vision", {"question": QUESTION})]] if "browser_vision" in conv.offered_tools else []),
    ]


def browser_fact(name: str, args: dict, output: str) -> str | None:
    if name == "browser_navigate":
        return f"browsed={args.get('url')}"
    if name == "browser_type":
        return f"typed={args.get('text')}"
    if name == "browser_vision":
        m = re.search(r'"analysis": "([^"]*)', output)
        return f"page={m[1]}" if m else None
    return None
