"""A small scripted OpenAI-compatible chat server for dry runs, demos, benchmarks and tests.

No real model is needed: the server answers ``POST /v1/chat/completions`` (streaming and not)
from a script, speaks the OpenAI wire format exactly, and can inject latency and errors.

Run it::

    hermes-batch mock-llm --port 8808                 # or: python -m mockllm --port 8808
    hermes-batch mock-llm --port 0 --latency 0.5      # port 0 picks a free port; the URL is printed

or in-process::

    with MockLLM(latency=0.1) as llm:                 # MockLLM(...).start() returns the base_url
        client = openai.OpenAI(base_url=llm.base_url, api_key="x")

Endpoints
---------
``POST /v1/chat/completions``  the model (``stream`` false or true, ``stream_options.include_usage``)
``GET  /v1/models``            one model, ``mock-model``
``GET  /health``               ``{"status": "ok"}``
``GET  /_mock/requests``       every chat request body received, in arrival order (for tests)
``GET  /_mock/stats``          call counters; ``POST /_mock/reset`` clears requests, stats, counters
``POST /v1/images/generations``, ``POST /v1/images/edits``   OpenAI's images API: small real PNGs
                               (b64_json, or url when asked), see mockllm.images
``GET  /_mock/image_requests`` every images API request (prompt, size, uploaded images' digests)

What the model answers
----------------------
The server keeps no conversation state: each answer depends only on the request (a branched
script's ``pass_on`` aside, which counts conversations). Let ``u`` be
the text of the last user message with a ``MOCK_SCRIPT`` line (else the last user message),
``n`` the number of assistant messages after it in
``messages``, and ``k`` the first 8 hex characters of sha256(``u``). Tool call ids are
``call_<k>_<n>_<i>``.

1. Scripted. If a line of ``u`` contains ``MOCK_SCRIPT: {json}`` (text may precede the marker;
   the JSON must sit on that one line, as ``json.dumps`` writes it)::

       MOCK_SCRIPT: {"turns": [
           {"reasoning": "...", "content": "...",
            "tool_calls": [{"name": "terminal", "arguments": {"command": "ls"}},
                           {"name": "no_such_tool", "arguments": "{not json"}]},
           {"error": 500},
           {"sleep": 2.5, "content": "slow final answer"}]}

   assistant turn ``n`` answers ``turns[n]``; past the end the answer is ``"Done."``. Tool calls
   need not name offered tools. Object arguments are JSON-encoded; string arguments are sent
   verbatim (to test unparseable arguments). ``"error": STATUS`` fails that turn every time it
   is asked (with ``"times": N`` only the first N times, then the turn answers as scripted); ``"sleep": S`` waits S seconds before answering. A malformed script is a 400.

   A task solved by chance (attempts of one task share their instruction): a script with a
   ``pass`` and a ``fail`` branch picks one per conversation at its first turn and keeps it::

       MOCK_SCRIPT: {"pass": {"turns": [...]}, "fail": {"turns": [...]}, "pass_chance": 0.5}
       MOCK_SCRIPT: {"pass": {"turns": [...]}, "fail": {"turns": [...]}, "pass_on": [2, 3]}

   ``pass_chance`` p draws from the request's ``seed`` (hermes ``--sampling_seed S`` sends one per
   attempt; without one, from the visit number): ``pass`` with probability p, the same on a rerun.
   ``pass_on`` lists which conversations opening with this message take ``pass`` (the 2nd and 3rd
   here, counted at first turns). The choice rides in the branch's tool call ids
   (``call_<k>P_<n>_<i>`` or ``call_<k>F_...``); a later turn without one takes ``fail``. See
   mockllm.branches.

2. Default scenario, using only the offered ``tools`` (matched by function name):

   * turn 0: reasoning and two parallel calls, ``write_file`` {"path": "notes/<k>.txt",
     "content": "token <k>\\n"} and ``terminal`` {"command": "cat /etc/hostname"};
     with ``--hallucinate-rate P`` a seeded share P of conversations also calls the
     non-existent tool ``web_fetch_imaginary`` here;
   * extra middle turns when ``--turns N`` > 3: ``terminal`` {"command": "echo step <i>"};
   * next: ``read_file`` {"path": "notes/<k>.txt"};
   * finally an answer with reasoning summarising the tool results it saw, e.g.
     ``"Done. hostname=<terminal output>; notes/<k>.txt=<read_file output>"``.

   * then, while the ``--turns`` budget lasts, ``image_generate`` and ``vision_analyze`` on the
     image it returned (mockllm.vision);

   Steps whose tools are not offered are skipped; with no tools offered it answers at once.
   ``--turns N`` (default 3) is the number of model calls a conversation takes when all three
   tools are offered.

A chat request whose last user message carries ``image_url`` parts is a vision request: the
answer says what each image is, read from its bytes (format, size, byte count, sha256 prefix).

Reasoning (``--reasoning``): ``field`` (default) sends it in both ``message.reasoning`` and
``message.reasoning_content`` (``delta.*`` when streaming); ``content`` only in
``reasoning_content``; ``inline`` as ``<think>...</think>`` at the start of the content;
``scratchpad`` as ``<REASONING_SCRATCHPAD>...</REASONING_SCRATCHPAD>`` in the content; ``none``
drops it.

Tool calls (``--tool-calls``): ``native`` (default) in ``message.tool_calls``; ``hermes``, ``json``,
``llama``, ``mistral`` or ``qwen3_coder`` written as text in the content in that model family's
format, after the turn's own text, as a server without a tool parser returns them; ``never``: prose
saying what it would do, no call (mockllm.textcalls).

Errors on demand: ``--fail-first N`` fails the first N requests of each conversation (keyed by
``u``); ``--error-rate P`` fails a seeded random share of requests. Both answer
``--error-status`` (429, 500 or 503) with an OpenAI error body ``{"error": {"message", "type",
"code"}}``; 429 and 503 carry ``Retry-After`` (and ``retry-after-ms``) of ``--retry-after`` seconds.
Bad request bodies get a 400 with an OpenAI error body.

A provider's rate limit: ``--rpm R`` answers 429 beyond R requests a minute (a token bucket
holding ``--burst`` requests, one second's worth by default), at once, with ``Retry-After`` and
"Please try again in 820ms."; every chat answer carries ``x-ratelimit-limit-requests``,
``x-ratelimit-remaining-requests`` and ``x-ratelimit-reset-requests`` (mockllm.ratelimit).
"""
from __future__ import annotations

from mockllm.cli import build_parser, main
from mockllm.conversation import BadRequest, MockConfig, Reply, ToolCall
from mockllm.scenario import build_reply
from mockllm.server import MockLLM

__all__ = ["MockConfig", "MockLLM", "Reply", "ToolCall", "BadRequest", "build_reply", "build_parser", "main"]
