"""The model endpoint: any OpenAI-compatible server.

Retries (429, 5xx, time-outs, dropped connections, with backoff and Retry-After honoured) are
the openai SDK's, kept as they were where the calls no longer go through it (hermes.model.calls);
every attempt passes the client's AdaptiveLimiter (hermes.model.ratelimit), shared by all threads
that use the client, so a rate-limited endpoint slows the whole run down; reasoning and
OpenRouter provider routing go in the request's extra body.
`complete_stream` asks for `stream: true` and hands each delta to a callback as it arrives
(the API server relays them to its clients); both methods return the same Reply.
"""
from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Coroutine, TypeVar

from hermes.data.failures import status_failure
from hermes.errors import HermesError
from hermes.environment import read
from hermes.lazyimport import imported
from hermes.model import logprobs, sampling
from hermes.model.breaker import Breaker
from hermes.model.calls import TIMED_OUT, CallError, CallLoop, Endpoint
from hermes.model.ratelimit import AdaptiveLimiter
from hermes.model import textcalls
from hermes.settings import AgentSettings

if TYPE_CHECKING:
    import openai

T = TypeVar("T")


class ModelError(HermesError):
    """The endpoint failed for good (after retries) or answered something unusable; each instance
    says its kind (the endpoint's status, a time-out...) and whether it passes."""


#: the kind of an answer that came but cannot be used (no choices, a malformed tool call or stream)
UNUSABLE = "model endpoint unusable answer"


def resolve_api_key(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    key = read("api_key")  # HERMES_API_KEY, OPENROUTER_API_KEY, OPENAI_API_KEY: the first set
    if key is not None:
        return key.get_secret_value()
    # Local OpenAI-compatible servers accept any key; a real endpoint answers 401, which is reported.
    return "no-key"


def extra_body(s: AgentSettings) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if s.reasoning_disabled:
        body["reasoning"] = {"effort": "none"}
    elif s.reasoning_effort:
        body["reasoning"] = {"enabled": True, "effort": s.reasoning_effort}
    provider: dict[str, Any] = {}
    for key, value in (("only", s.providers_allowed), ("ignore", s.providers_ignored),
                       ("order", s.providers_order), ("sort", s.provider_sort)):
        if value:
            provider[key] = value
    if provider:
        body["provider"] = provider
    body.update(sampling.body_fields(s))  # temperature ... --extra_body (hermes.model.sampling)
    return body


@dataclass
class Reply:
    message: dict[str, Any]          # assistant message, API format, reasoning in "reasoning"
    usage: dict[str, int] = field(default_factory=dict)
    finish_reason: str | None = None


#: receives ("content" | "reasoning", text) for each streamed delta
DeltaCallback = Callable[[str, str], None]


class ModelClient:
    """One endpoint for a whole run, shared by all its prompts.

    Calls go out from one event loop on a thread of its own, over one aiohttp pool
    (hermes.model.calls). A batch run's prompts are coroutines on that loop (start_on_loop) and
    await complete_async() there; complete() is for a thread (a chat, an API request), which
    hands its request over and waits for the answer. With hundreds of prompt threads each doing
    its own HTTP, they queued on the sync pools' lock and scans, and later on the interpreter
    lock's hand-over of every answer (bench/THROUGHPUT.md, workload 4).
    complete_stream() (the API server's, a few at a time) stays on a sync client of the same
    limiter: its deltas are relayed on the caller's own thread, as the agent's callbacks expect.
    """

    def __init__(self, settings: AgentSettings, api_key: str | None = None, *, max_retries: int | None = None,
                 timeout: float | None = None, max_in_flight: int | None = None):
        """max_in_flight: the limiter's ceiling; a run's --num_workers by default (64 for a chat).
        timeout: each request's, in seconds; the settings' --request_timeout by default."""
        self.model = settings.model
        self.max_tokens = settings.max_tokens
        self.extra_body = extra_body(settings)
        self.tool_call_parser = settings.tool_call_parser  # calls written as text: hermes.model.textcalls
        self.sampling_seed = settings.sampling_seed
        self.context_length = settings.context_length  # tool results are cut to fit it (hermes.model.context)
        self.api_key = resolve_api_key(api_key)
        ceiling = max_in_flight or getattr(settings, "num_workers", None) or 64
        self.limiter = AdaptiveLimiter(ceiling)
        self.breaker = Breaker(settings.breaker_seconds)  # shared by every request of the run
        self._base_url = settings.base_url
        self._max_retries = settings.max_retries if max_retries is None else max_retries
        self._timeout = settings.request_timeout if timeout is None else timeout
        self._lock = threading.Lock()
        self._loop: CallLoop | None = None
        self._sync: openai.OpenAI | None = None
        self._closed = False

    @property
    def client(self) -> openai.OpenAI:
        """The sync SDK client of the streams, made on first use (the SDK is imported then)."""
        return self._made("_sync", self._new_sync_client)

    def _new_sync_client(self) -> openai.OpenAI:
        sdk = imported("hermes.model.sdk")
        return sdk.openai.OpenAI(base_url=self._base_url, api_key=self.api_key, timeout=self._timeout,
                                 max_retries=self._max_retries,
                                 http_client=sdk.LimitedHttpClient(self.limiter, timeout=self._timeout))

    def _calls(self) -> CallLoop:
        return self._made("_loop", lambda: CallLoop(lambda: Endpoint(
            self._base_url, self.api_key, limiter=self.limiter, max_retries=self._max_retries, timeout=self._timeout,
            breaker=self.breaker)))

    def _made(self, name: str, make: Callable[[], Any]) -> Any:
        """self.<name>, made once under the lock; read once outside it (close() may clear it meanwhile)."""
        value = getattr(self, name)
        if value is None:
            with self._lock:
                if self._closed:
                    raise ModelError("the model client is closed")
                if getattr(self, name) is None:
                    setattr(self, name, make())
                value = getattr(self, name)
        return value

    def _request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.model, "messages": [_for_api(m) for m in messages]}
        if tools:
            kwargs["tools"] = tools
        if self.max_tokens:
            kwargs["max_tokens"] = self.max_tokens
        seed = sampling.seed_for(self.sampling_seed, messages)  # this prompt's, this turn's
        if self.extra_body or seed is not None:
            kwargs["extra_body"] = {**self.extra_body, **({"seed": seed} if seed is not None else {})}
        return kwargs

    def _body(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        # The body as is, from one event loop (hermes.model.calls): `chat.completions.create`
        # would deep-copy and re-validate the whole conversation on every call, and wrap the
        # answer in models only to be turned back into a dict here.
        request = self._request(messages, tools)
        extra = request.pop("extra_body", {})
        return {**request, **extra}  # as the SDK merges extra_body: its keys win

    def _failed(self, e: CallError) -> ModelError:
        """A failed call as the ModelError the agent sees; a time-out names the setting that bounds it
        (a slow CPU server exceeds the default on its first prompt: the fix is to raise it)."""
        said = str(e)
        if e.kind == TIMED_OUT:
            said += f" No answer within --request_timeout {self._timeout:g} s."
        return ModelError(said, kind=e.kind, transient=e.transient)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Reply:
        try:
            return self._read(self._calls().post(self._body(messages, tools)), messages, tools)
        except CallError as e:
            raise self._failed(e) from e

    async def complete_async(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Reply:
        """complete() for a coroutine running on this client's loop (run_on_loop)."""
        try:
            return self._read(await self._calls().endpoint.post(self._body(messages, tools)), messages, tools)
        except CallError as e:
            raise self._failed(e) from e

    def start_on_loop(self, coroutine: Coroutine[Any, Any, T]) -> "concurrent.futures.Future[T]":
        """Start `coroutine` on the event loop this client's calls go out from (one per client,
        on a thread of its own): a batch's prompts are coroutines there (hermes.run.runner), each
        model call awaited on the loop without a thread to wake."""
        try:
            return self._calls().submit(coroutine)
        except CallError as e:
            raise ModelError(str(e), kind=e.kind, transient=e.transient) from e

    def run_on_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """start_on_loop(coroutine)'s result, waited for here; an interrupted caller cancels it."""
        try:
            return self._calls().run(coroutine)
        except CallError as e:
            raise ModelError(str(e), kind=e.kind, transient=e.transient) from e

    def complete_stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                        on_delta: DeltaCallback) -> Reply:
        """complete() with `stream: true`: on_delta sees content and reasoning as they arrive.

        The SDK's own stream state assembles the chunks (tool-call arguments included) into
        the completion a non-streamed call would have returned.
        """
        client = self.client
        sdk = imported("hermes.model.sdk")
        state = sdk.ChatCompletionStreamState()
        try:
            stream = client.chat.completions.create(**self._request(messages, tools), stream=True,
                                                    stream_options={"include_usage": True})
            with stream:
                for chunk in stream:
                    state.handle_chunk(chunk)
                    for choice in chunk.choices:
                        _relay_delta(choice.delta, on_delta)
            resp = state.get_final_completion()
        except sdk.openai.APIStatusError as e:
            failure = status_failure(e.status_code)
            raise ModelError(f"model endpoint answered {e.status_code}: {_error_text(e)}",
                             kind=failure.kind, transient=failure.transient) from e
        except sdk.openai.APIError as e:
            kind = (TIMED_OUT if isinstance(e, sdk.openai.APITimeoutError) else
                    "model endpoint connection failed" if isinstance(e, sdk.openai.APIConnectionError) else
                    "model endpoint failed")
            raise self._failed(CallError(f"model endpoint failed: {e}", kind=kind, transient=True)) from e
        except (AssertionError, RuntimeError) as e:  # the stream state refuses a stream that never began
            raise ModelError(f"model endpoint sent an unusable stream: {e}", kind=UNUSABLE) from e
        return self._read(resp.model_dump(exclude_none=True), messages, tools)

    def _read(self, resp: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Reply:
        """The reply, its calls normalised once here: calls written as text recovered (hermes.model.textcalls)."""
        reply = _reply_of_dict(resp)
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        textcalls.normalise(reply.message, tools, self.tool_call_parser, turn)
        return reply

    def close(self) -> None:
        """Close the pools and end the loop's thread; a call still out then fails with ModelError."""
        with self._lock:
            self._closed = True
            loop, self._loop = self._loop, None
            sync, self._sync = self._sync, None
        if loop is not None:
            loop.close()
        if sync is not None:
            sync.close()


def _relay_delta(delta: Any, on_delta: DeltaCallback) -> None:
    extra = delta.model_extra or {}
    # Endpoints name reasoning either way, OpenRouter sends both: relay it once.
    reasoning = extra.get("reasoning") or extra.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        on_delta("reasoning", reasoning)
    if delta.content:
        on_delta("content", delta.content)


def _reply_of_dict(resp: Any) -> Reply:
    choices = resp.get("choices") if isinstance(resp, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise ModelError("model endpoint answered with no choices", kind=UNUSABLE)
    choice = choices[0]
    raw = choice.get("message") or {}
    message: dict[str, Any] = {"role": "assistant", "content": raw.get("content")}
    reasoning = raw.get("reasoning") or raw.get("reasoning_content")
    if reasoning:
        message["reasoning"] = reasoning
    try:
        if raw.get("tool_calls"):
            message["tool_calls"] = [
                {"id": tc["id"], "type": "function",
                 "function": {"name": tc["function"]["name"], "arguments": tc["function"].get("arguments") or ""}}
                for tc in raw["tool_calls"]
            ]
    except (KeyError, TypeError) as e:
        raise ModelError(f"model endpoint answered a malformed tool call: {raw.get('tool_calls')!r:.300}",
                         kind=UNUSABLE) from e
    turn_logprobs = logprobs.of_choice(choice)  # asked with --logprobs (hermes.model.logprobs)
    if turn_logprobs is not None:
        message[logprobs.KEY] = turn_logprobs
    usage = resp.get("usage") or {}
    usage = {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens") if isinstance(usage.get(k), int)}
    return Reply(message=message, usage=usage, finish_reason=choice.get("finish_reason"))


_NOT_SENT = ("reasoning", "reasoning_content", textcalls.ARRIVAL_KEY, logprobs.KEY)


def _for_api(message: dict[str, Any]) -> dict[str, Any]:
    # Reasoning and logprobs are kept for the trajectory but not sent back, nor how the calls arrived:
    # strict endpoints reject unknown fields. A call recovered from text goes back as the native call it became.
    sent = {k: v for k, v in message.items() if k not in _NOT_SENT}
    if sent.get("tool_calls") and sent.get("content") is None:
        sent["content"] = ""  # llama.cpp's server answers 500 to a null content beside tool_calls
    return sent


def _error_text(e: openai.APIStatusError) -> str:
    body = e.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(e.message)
