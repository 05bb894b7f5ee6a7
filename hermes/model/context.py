"""The model's context length: an endpoint's "too long" answer, and tool results cut to fit.

An endpoint that refuses a conversation for its length will refuse it every time: it is no
transient failure to retry, and resuming the prompt would fail it again forever. The prompt ends
as partial with the reason `context_length`, its trajectory so far kept (hermes.agent.conversation).
"""
from __future__ import annotations

import json
import re
from typing import Any

#: the kind (hermes.errors) of an endpoint's refusal of a conversation too long for the model
CONTEXT_LENGTH = "context_length"

# OpenAI: error.code "context_length_exceeded" ("This model's maximum context length is N tokens");
# vLLM: "This model's maximum context length is N tokens. However, you requested M tokens" (400);
# llama.cpp: "the request exceeds the available context size, try increasing it" (400);
# SGLang: "The input (N tokens) is longer than the model's context length (M tokens)";
# Ollama / others: "context length exceeded", "prompt is too long".
_PATTERNS = re.compile(
    rb"context_length_exceeded|maximum context length|exceeds the available context size|"
    rb"longer than the model's context length|context length exceeded|context window|prompt is too long",
    re.IGNORECASE)
#: characters per token assumed when cutting text to a token budget (a safe side for English and code)
CHARS_PER_TOKEN = 3


def context_exceeded(status: int, raw: bytes) -> bool:
    """Whether an endpoint's error answer says the conversation is longer than the model's context."""
    return status in (400, 413, 422) and bool(_PATTERNS.search(raw[:4000]))


def estimated_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def cut_to_fit(text: str, budget_tokens: int) -> str:
    """Text cut to about `budget_tokens`, head and tail kept, with a note saying what was left out."""
    limit = max(budget_tokens, 64) * CHARS_PER_TOKEN
    if len(text) <= limit:
        return text
    note = f"\n[... {{}} characters cut to fit the model's context ...]\n"
    keep = max(limit - len(note) - 8, 0)
    head, tail = keep * 2 // 3, keep - keep * 2 // 3
    return text[:head] + note.format(len(text) - head - tail) + (text[len(text) - tail:] if tail else "")


#: tokens kept free for the answer when --max_tokens does not say
ANSWER_RESERVE = 1024


def fit_results(results: list[str], conversation: list[dict[str, Any]], context_length: int | None,
                max_tokens: int | None) -> list[str]:
    """A turn's tool results, cut (head and tail kept) so that the conversation plus them plus the
    answer's room stays within `context_length`, each result getting an equal share of what is
    left; unchanged where the context is unknown or they fit. A count by characters, on the safe
    side: the endpoint's tokenizer is not at hand."""
    if not context_length or not results:
        return results
    used = estimated_tokens(json.dumps(conversation, ensure_ascii=False, default=str))
    room = context_length - used - (max_tokens or ANSWER_RESERVE)
    if sum(estimated_tokens(r) for r in results) <= room:
        return results
    share = max(room // len(results), 0)
    return [cut_to_fit(r, share) if isinstance(r, str) else r for r in results]
