"""Logprobs on demand, as OpenAI-compatible servers send them (`logprobs: true` in the request).

The answer's text (its content, then each tool call's name and arguments) is cut into word and
space pieces, each a "token" with a logprob drawn from a generator seeded by the piece and its
place, so the same answer always carries the same numbers. With vLLM's
`return_tokens_as_token_ids` each token is named "token_id:N" instead (N: a stable id of the piece).
"""
from __future__ import annotations

import hashlib
import re
from typing import Any

_PIECES = re.compile(r"\s+|[^\s]+")


def _number(piece: str, place: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{place}\0{piece}".encode(), digest_size=4).digest(), "big")


def add_logprobs(completion: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The completion with `choices[0].logprobs.content` filled in, when the request asked for it."""
    if not body.get("logprobs"):
        return completion
    as_ids = bool(body.get("return_tokens_as_token_ids"))
    for choice in completion.get("choices") or []:
        message = choice.get("message") or {}
        text = (message.get("content") or "") + "".join(
            c["function"]["name"] + c["function"]["arguments"] for c in message.get("tool_calls") or [])
        content = []
        for place, piece in enumerate(_PIECES.findall(text)):
            n = _number(piece, place)
            token = f"token_id:{n % 150_000}" if as_ids else piece
            content.append({"token": token, "logprob": -round((n % 10_000) / 1_000, 4),
                            "bytes": list(piece.encode()), "top_logprobs": []})
        choice["logprobs"] = {"content": content}
    return completion
