"""Sampling settings on the wire, and the seed each model call of each prompt sends.

temperature, top_p, stop and seed are OpenAI's own request fields; top_k and min_p are not, but
vLLM, SGLang, llama.cpp and Ollama's OpenAI-compatible servers read them from the body, so they
go there the way `extra_body` does; --extra_body (any server's own field: chat_template_kwargs,
repetition_penalty...) is merged last and wins.

--sampling_seed S: a call's seed is derived from S, the prompt's content key (which already
names its attempt of --attempts K) and the turn (assistant messages so far). A rerun of the same
row sends the same seeds, so a server that honours seeds repeats itself; K attempts of one row
send K different seeds, so they differ even where the server would otherwise answer alike.
The prompt's key reaches the client through a context variable set around the prompt's run
(for_prompt): the model client is shared by every prompt of a run and the loop between them
does not need to know.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
from typing import Any, Iterator

from hermes.settings import AgentSettings

#: the content key of the prompt whose calls go out in this context (None: a chat, an API request)
_PROMPT_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("hermes_prompt_key", default=None)
#: the settings a resumed run compares with run.json: a change mixes two samplings in one dataset
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "stop", "extra_body", "sampling_seed", "max_tokens",
                   "logprobs")


def body_fields(s: AgentSettings) -> dict[str, Any]:
    """What every request of the run carries for its sampling (besides the seed)."""
    body: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k", "min_p", "stop"):
        value = getattr(s, name)
        if value is not None:
            body[name] = value
    if s.logprobs:
        # vLLM also names each token by its id ("token_id:N"): what an RL trainer needs, no retokenising
        body.update({"logprobs": True, "return_tokens_as_token_ids": True})
    body.update(s.extra_body or {})
    return body


def call_seed(sampling_seed: int, key: str, turn: int) -> int:
    """The seed of one call: stable across reruns, distinct across keys (attempts) and turns."""
    digest = hashlib.blake2b(f"{sampling_seed}\0{key}\0{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 33  # 31 bits: servers that keep a 32-bit seed take it whole


def seed_for(sampling_seed: int | None, messages: list[dict[str, Any]]) -> int | None:
    key = _PROMPT_KEY.get()
    if sampling_seed is None or key is None:
        return None
    return call_seed(sampling_seed, key, sum(1 for m in messages if m.get("role") == "assistant"))


@contextlib.contextmanager
def for_prompt(key: str) -> Iterator[None]:
    """The model calls made in this context (a prompt's coroutine) belong to the prompt `key`."""
    token = _PROMPT_KEY.set(key)
    try:
        yield
    finally:
        _PROMPT_KEY.reset(token)


def changed(before: dict[str, Any], now: AgentSettings) -> dict[str, tuple[Any, Any]]:
    """{field: (before, now)} of the sampling settings a resume changes (before: run.json's settings)."""
    current = now.model_dump(mode="json")
    return {f: (before.get(f), current.get(f)) for f in SAMPLING_FIELDS if f in before and before.get(f) != current.get(f)}
