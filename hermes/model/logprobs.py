"""The tokens an assistant turn was made of and their logprobs (--logprobs), for RL trainers.

Trainers (verifiers/prime-rl, SkyRL, NeMo-RL) train on the tokens the model produced with their
logprobs; retokenising ShareGPT text drifts from them. The endpoint is asked `logprobs: true`
(vLLM also `return_tokens_as_token_ids`: each token named "token_id:N", no retokenising at all;
hermes.model.sampling); OpenAI's answer shape, which vLLM, SGLang and llama.cpp's server share, is
`choices[0].logprobs.content = [{"token", "logprob", "bytes", "top_logprobs"}]`.
Kept compact: per turn two parallel lists, no bytes nor top_logprobs, on the assistant message
while the loop runs (never sent back: hermes.model.client._for_api) and in the journal entry's
`hermes.logprobs`, not in the ShareGPT line (hermes-batch export --format rl writes them).
"""
from __future__ import annotations

from typing import Any

#: the key under which an assistant message carries its turn's tokens while the loop runs
KEY = "logprobs"
TOKEN_ID = "token_id:"


def of_choice(choice: dict[str, Any]) -> dict[str, list] | None:
    """{"tokens": [...], "logprobs": [...]} of a completion's choice, or None where it has none."""
    content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    if not isinstance(content, list):
        return None
    tokens, logprobs = [], []
    for item in content:
        if isinstance(item, dict) and isinstance(item.get("token"), str):
            tokens.append(item["token"])
            value = item.get("logprob")
            logprobs.append(float(value) if isinstance(value, (int, float)) else None)
    return {"tokens": tokens, "logprobs": logprobs}


def per_turn(messages: list[dict[str, Any]]) -> list[dict[str, list]]:
    """One {"tokens", "logprobs"} per assistant message, in order (empty lists where the endpoint gave none)."""
    return [m.get(KEY) or {"tokens": [], "logprobs": []} for m in messages if m.get("role") == "assistant"]


def token_ids(tokens: list[str]) -> list[int]:
    """The ids of tokens named "token_id:N" (vLLM's return_tokens_as_token_ids); [] if any is not."""
    if not tokens or not all(t.startswith(TOKEN_ID) and t[len(TOKEN_ID):].isdigit() for t in tokens):
        return []
    return [int(t[len(TOKEN_ID):]) for t in tokens]
