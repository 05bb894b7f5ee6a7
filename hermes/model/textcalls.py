"""Tool calls a model wrote as text in its answer, recovered as the tool calls they are.

Open models are often served without a tool parser (vLLM/SGLang without `--tool-call-parser`,
llama.cpp with the model's own template, Ollama with a template that does not know tools): the
server then hands back the model's call as text in `content`, and an agent that reads only the
native `tool_calls` takes it for the final answer. `normalise` is called once, where the client
reads a reply (hermes.model.client), so the loop, the trajectory and the statistics see a
recovered call exactly as a native one: the prose around it stays the turn's text, the call gets
an id, and the message remembers how its calls arrived in a private field (ARRIVAL_KEY) that is
never sent back to the endpoint nor written to a trajectory.

How `auto` decides (README "Running against open models"):
* native `tool_calls` in the answer win; the text is then left alone;
* an explicit call marker is a call whatever the name: `<tool_call>...</tool_call>` (Hermes,
  Qwen; a JSON object, or Qwen3-coder's `<function=NAME><parameter=K>v</parameter></function>`),
  `<function=NAME>{...}</function>` (Llama 3.x), `[TOOL_CALLS]` (Mistral), `<tools>{"name",
  "arguments"}</tools>` (seen from Qwen2.5-Coder); an unknown name or JSON that does not parse is
  answered with the same error result a native call would get, so the model can correct itself;
* calls inside `<tools>` written as XML elements (`<function name="X" arguments='{...}'/>`, ...,
  hermes.model.callsyntax; Qwen2.5-Coder again) count only when every name is an offered tool:
  XML is also how a model echoes or describes its tool list;
* a Python call list (`[terminal(command="ls")]`, Llama 3.2's pythonic format) counts only when it
  is the whole answer and every name is an offered tool;
* the same call twice in one answer (same name, same arguments once canonical: a model that
  repeats its `<tool_call>` in a summary fence) runs once;
* JSON without a marker (a fenced ```json block, or an answer that is nothing but a JSON object,
  Llama's `{"name", "parameters"}`) is a call only when it has exactly the call's shape (`name`
  plus `arguments` or `parameters`) AND names a tool offered to this prompt: an answer that shows
  JSON as an example is not a call;
* text inside `<think>` blocks is never a call (a model thinking about what it will call).
An explicit `--tool_call_parser FORMAT` looks for that format only, and there takes unmarked JSON
of the call's shape whatever its name (an unknown one gets the error result).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from hermes.model import callsyntax
from hermes.model.callsyntax import encode_arguments, native_arguments  # noqa: F401 (normalise's, and the tests')

#: the --tool_call_parser choices (hermes.settings)
PARSERS = ("auto", "native", "hermes", "json", "llama", "mistral", "qwen3_coder", "pythonic", "none")
#: how a call can arrive; statistics.json counts calls by these
FORMATS = ("native", "hermes", "json", "llama", "mistral", "qwen3_coder", "pythonic")
#: the private field of an assistant message with recovered calls: each call's format, in call order
ARRIVAL_KEY = "hermes_tool_calls_from"
#: the name given to a call whose marker holds no readable name (it gets the unknown-tool error)
UNREADABLE = "unreadable_tool_call"


@dataclass(frozen=True)
class TextCall:
    name: str
    arguments: str   # the JSON text of the arguments, or the raw text when it is not valid JSON
    format: str


@dataclass(frozen=True)
class Recovered:
    content: str          # the prose around the calls
    calls: list[TextCall]


# --------------------------------------------------------------------------- finders

#: (start, end, calls) of one piece of text that holds calls
Span = tuple[int, int, list[TextCall]]
#: a finder: (text, offered tool schemas by name, explicit mode) -> spans
Finder = Callable[[str, dict[str, dict], bool], Iterator[Span]]

_DECODER = json.JSONDecoder()
_NAME = re.compile(r'"name"\s*:\s*"([^"\\]{1,200})"')
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_TOOLS = re.compile(r"<tools>(.*?)</tools>", re.DOTALL)
_QWEN_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_LLAMA_FUNCTION = re.compile(r"<function=([A-Za-z0-9_.\-]+)>\s*(\{.*?\})\s*</function>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
_FENCE = re.compile(r"```[ \t]*(?:json|JSON|tool_call|tool_code)?[ \t]*\n(.*?)```", re.DOTALL)
_MISTRAL = "[TOOL_CALLS]"
_MISTRAL_V11 = re.compile(r"\s*([A-Za-z0-9_.\-]+)\[ARGS\]")
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)|<REASONING_SCRATCHPAD>.*?(?:</REASONING_SCRATCHPAD>|\Z)", re.DOTALL)


def _leading(text: str) -> tuple[list[Any], int]:
    """The JSON values at the start of `text`, one after another (separated by blanks, `;` or `,`),
    and where they end; prose after them is left."""
    values: list[Any] = []
    i = end = 0
    n = len(text)
    while True:
        while i < n and (text[i].isspace() or (values and text[i] in ";,")):
            i += 1
        try:
            value, i = _DECODER.raw_decode(text, i)
        except ValueError:
            return values, end
        values.append(value)
        end = i


def _objects(text: str) -> list[Any] | None:
    """The JSON values `text` is made of; None when any part of it is not JSON."""
    values, end = _leading(text)
    return values if values and not text[end:].strip() else None


def _flat(values: list[Any]) -> list[Any]:
    return [v for value in values for v in (value if isinstance(value, list) else [value])]


def _call_of(obj: Any, fmt: str, marked: bool = True) -> TextCall | None:
    """A call from an object of the call's shape: `name` and `arguments` (or `parameters`), nothing
    else but an `id`/`type`; OpenAI's own `{"type": "function", "function": {...}}` too. Inside a
    marker the arguments may be left out (a tool without any); unmarked, a bare `{"name": ...}` is a record."""
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict) and set(obj) <= {"id", "type", "function"}:
        obj = obj["function"]
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
        return None
    keys = set(obj) - {"id", "type"}
    args_key = "arguments" if "arguments" in obj else "parameters" if "parameters" in obj else None
    if keys - {"name", args_key} or (args_key is None and not marked):
        return None
    return TextCall(obj["name"].strip(), encode_arguments(obj.get(args_key) if args_key else None), fmt)


def _unreadable(inner: str, fmt: str) -> TextCall:
    """A marked call whose JSON does not parse: its name where one can be read, the text as arguments."""
    named = _NAME.search(inner)
    return TextCall(named.group(1) if named else UNREADABLE, inner.strip(), fmt)


def _marked_json(inner: str, fmt: str) -> list[TextCall]:
    """The calls inside an explicit marker: each object of the call's shape; one error call when
    the text is not JSON or is JSON of another shape (the model meant a call: it gets told why not)."""
    values = _objects(inner)
    if values is None:
        return [_unreadable(inner, fmt)]
    calls = [_call_of(v, fmt) for v in _flat(values)]
    if calls and all(calls):
        return calls  # type: ignore[return-value]
    return [_unreadable(inner, fmt)]


def _qwen3_coder_call(name: str, body: str, tools: dict[str, dict]) -> TextCall:
    """`<function=NAME><parameter=K>value</parameter>...</function>`: each value a string unless the
    tool's schema says otherwise, then read as JSON (as vLLM's qwen3_coder parser does)."""
    if "<parameter=" not in body and body.strip().startswith("{"):  # JSON arguments inside the XML tags
        values = _objects(body.strip())
        if values and len(values) == 1 and isinstance(values[0], dict):
            return TextCall(name, encode_arguments(values[0]), "qwen3_coder")
    props = ((tools.get(name) or {}).get("parameters") or {}).get("properties") or {}
    return TextCall(name, json.dumps(callsyntax.parameters(body, props), ensure_ascii=False), "qwen3_coder")


def _hermes(text: str, tools: dict[str, dict], explicit: bool) -> Iterator[Span]:
    for m in _TOOL_CALL.finditer(text):
        inner = m.group(1).strip()
        unterminated = not m.group(0).endswith("</tool_call>")
        if inner.startswith("<function="):
            continue  # Qwen3-coder's XML inside the same tags: its own finder
        if not inner.startswith(("{", "[")):
            # `<tool_call>` named in prose ("wrap each call in <tool_call> tags"): not a call
            continue
        if unterminated and _objects(inner) is None:
            continue  # an answer cut short mid-call is not taken for a call of its own
        yield m.start(), m.end(), _marked_json(inner, "hermes")
    for m in _TOOLS.finditer(text):
        values = _objects(m.group(1))
        if values is None:  # not JSON: XML elements (hermes.model.callsyntax), offered names only in auto
            written = callsyntax.xml_calls(m.group(1), tools)
            if written and (explicit or all(name in tools for name, _ in written)):
                yield m.start(), m.end(), [TextCall(n, encode_arguments(a), "hermes") for n, a in written]
            continue
        calls = [_call_of(v, "hermes") for v in _flat(values)]
        if calls and all(calls):  # the tool list echoed back (names with descriptions) is not a call
            yield m.start(), m.end(), calls  # type: ignore[misc]


def _qwen3_coder(text: str, tools: dict[str, dict], explicit: bool) -> Iterator[Span]:
    for m in _TOOL_CALL.finditer(text):
        inner = m.group(1).strip()
        if not inner.startswith("<function="):
            continue
        calls = [_qwen3_coder_call(f.group(1), f.group(2), tools) for f in _QWEN_FUNCTION.finditer(inner)]
        if calls:
            yield m.start(), m.end(), calls
    # the same without the <tool_call> wrapper, as some templates write it; parameters tell it from Llama's
    for f in _QWEN_FUNCTION.finditer(text):
        if "<parameter=" in f.group(2) or (explicit and not f.group(2).lstrip().startswith("{")):
            yield f.start(), f.end(), [_qwen3_coder_call(f.group(1), f.group(2), tools)]


def _llama(text: str, tools: dict[str, dict], explicit: bool) -> Iterator[Span]:
    for m in _LLAMA_FUNCTION.finditer(text):
        name, body = m.group(1), m.group(2)
        values = _objects(body)
        args = values[0] if values and len(values) == 1 else None
        call = (TextCall(name, encode_arguments(args), "llama") if isinstance(args, dict)
                else TextCall(name, body.strip(), "llama"))
        yield m.start(), m.end(), [call]
    at = text.find(_PYTHON_TAG)
    if at >= 0:
        after = at + len(_PYTHON_TAG)
        values, end = _leading(text[after:])
        calls = [_call_of(v, "llama") for v in _flat(values)]
        if calls and all(calls):
            yield at, after + end, calls  # type: ignore[misc]
        else:
            yield at, len(text), [_unreadable(text[after:], "llama")]
    else:
        yield from _whole_json(text, tools, explicit, "llama", require_key="parameters")


def _json(text: str, tools: dict[str, dict], explicit: bool) -> Iterator[Span]:
    for m in _FENCE.finditer(text):
        calls = _unmarked(m.group(1), tools, explicit, "json")
        if calls:
            yield m.start(), m.end(), calls
    yield from _whole_json(text, tools, explicit, "json")


def _whole_json(text: str, tools: dict[str, dict], explicit: bool, fmt: str,
                require_key: str | None = None) -> Iterator[Span]:
    """An answer that is nothing but calls as JSON (one object, several, or a list of them)."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return
    values = _objects(stripped)
    if values is None:
        return
    if require_key and not all(isinstance(v, dict) and require_key in v for v in _flat(values)):
        return
    calls = _unmarked(stripped, tools, explicit, fmt)
    if calls:
        start = text.index(stripped[0])
        yield start, start + len(stripped), calls


def _unmarked(body: str, tools: dict[str, dict], explicit: bool, fmt: str) -> list[TextCall]:
    """Calls written as JSON without a marker: all of the call's shape, and (auto) offered tools."""
    values = _objects(body)
    if values is None:
        return []
    calls = [_call_of(v, fmt, marked=False) for v in _flat(values)]
    if not calls or not all(calls):
        return []
    if not explicit and not all(c.name in tools for c in calls):  # type: ignore[union-attr]
        return []
    return calls  # type: ignore[return-value]


def _mistral(text: str, tools: dict[str, dict], explicit: bool) -> Iterator[Span]:
    at = text.find(_MISTRAL)
    while at >= 0:
        after = at + len(_MISTRAL)
        nxt = text.find(_MISTRAL, after)
        end = len(text) if nxt < 0 else nxt
        body = text[after:end]
        v11 = _MISTRAL_V11.match(body)
        if v11:  # the v11 tokenizer's [TOOL_CALLS]name[ARGS]{...}
            values, used = _leading(body[v11.end():])
            if len(values) >= 1 and isinstance(values[0], dict):
                yield at, after + v11.end() + used, [TextCall(v11.group(1), encode_arguments(values[0]), "mistral")]
            else:
                yield at, end, [TextCall(v11.group(1), body[v11.end():].strip(), "mistral")]
        elif body.lstrip().startswith(("[", "{")):
            values, used = _leading(body)
            calls = [_call_of(v, "mistral") for v in _flat(values)]
            if calls and all(calls):
                yield at, after + used, calls  # type: ignore[misc]
            else:
                yield at, end, [_unreadable(body, "mistral")]
        at = nxt


def _pythonic(text: str, tools: dict[str, dict], explicit: bool) -> Iterator[Span]:
    """A whole answer that is a Python call list; in auto only when every name is an offered tool."""
    written = callsyntax.python_calls(text)
    if written and (explicit or all(name in tools for name, _ in written)):
        yield 0, len(text), [TextCall(n, encode_arguments(a), "pythonic") for n, a in written]


#: each explicit --tool_call_parser's finders; `auto` uses them all
FINDERS: dict[str, tuple[Finder, ...]] = {
    "hermes": (_hermes,),
    "qwen3_coder": (_qwen3_coder,),
    "llama": (_llama,),
    "mistral": (_mistral,),
    "json": (_json,),
    "pythonic": (_pythonic,),
}
FINDERS["auto"] = (_hermes, _qwen3_coder, _mistral, _llama, _json, _pythonic)


# --------------------------------------------------------------------------- recovery

def recover(text: str, tools: list[dict[str, Any]], parser: str = "auto") -> Recovered | None:
    """The calls written in `text` for a prompt offered `tools` (OpenAI tool schemas), and the prose
    around them; None when there are none (or `parser` looks at native calls only)."""
    if parser not in PARSERS:
        raise ValueError(f"tool_call_parser must be one of {', '.join(PARSERS)}, not {parser!r}")
    finders = FINDERS.get(parser)
    if not finders or not text or not tools or not _may_hold_calls(text):
        return None
    offered = {fn["name"]: fn for fn in (_function(t) for t in tools) if isinstance(fn.get("name"), str)}
    thinking = [m.span() for m in _THINK.finditer(text)]
    spans: list[Span] = []
    for finder in finders:
        for start, end, calls in finder(text, offered, parser != "auto"):
            if any(s < end and start < e for s, e in thinking):
                continue  # a model thinking about a call has not made it
            if any(s < end and start < e for s, e, _ in spans):
                continue  # found already by an earlier (more specific) finder
            spans.append((start, end, calls))
    if not spans:
        return None
    spans.sort(key=lambda s: s[0])
    prose, at = [], 0
    for start, end, _ in spans:
        prose.append(text[at:start])
        at = end
    prose.append(text[at:])
    content = "\n".join(p.strip() for p in prose if p.strip())
    return Recovered(content=content, calls=_once([c for _, _, calls in spans for c in calls]))


def _once(calls: list[TextCall]) -> list[TextCall]:
    """Each call once: a model that repeats a call in the same answer (its `<tool_call>`, then the
    same in a summary fence) meant one, and running it twice can do harm (an append, a POST).
    The first keeps its place and format; the same name with other arguments is another call."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for call in calls:
        key = (call.name, _canonical(call.arguments))
        if key not in seen:
            seen.add(key)
            kept.append(call)
    return kept


def _canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, ensure_ascii=False)
    except ValueError:
        return arguments.strip()


#: what any call written as text holds: a marker, a fence, or (a whole answer of JSON) a leading { or [
_MARKS = ("<tool_call>", "<tools>", "<function=", _MISTRAL, _PYTHON_TAG, "```", callsyntax.PYTHON_START)


def _may_hold_calls(text: str) -> bool:
    """Whether `text` is worth the finders: most answers are prose, told apart here by substring
    searches instead of a pass of every finder's pattern over them."""
    return text.lstrip()[:1] in ("{", "[") or any(mark in text for mark in _MARKS)


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool["function"] if isinstance(tool.get("function"), dict) else tool


def call_id(turn: int, index: int) -> str:
    """A recovered call's id: unique in its conversation, the same on every rerun of the same answers."""
    return f"call_text_{turn}_{index}"


def normalise(message: dict[str, Any], tools: list[dict[str, Any]], parser: str, turn: int) -> dict[str, Any]:
    """An assistant message as the loop takes it: native calls' string-encoded arguments decoded,
    or (none native) the calls written in its content recovered as native ones (changed in place).
    `turn`: how many assistant messages came before it in the conversation (for the ids)."""
    native = message.get("tool_calls")
    if native:
        for call in native:
            call["function"]["arguments"] = native_arguments(call["function"].get("arguments"))
        return message
    content = message.get("content")
    found = recover(content, tools, parser) if isinstance(content, str) else None
    if found is None:
        return message
    message["content"] = found.content
    message["tool_calls"] = [{"id": call_id(turn, i), "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}}
                             for i, c in enumerate(found.calls)]
    message[ARRIVAL_KEY] = [c.format for c in found.calls]
    return message


def arrivals(messages: list[dict[str, Any]]) -> dict[str, int]:
    """Calls of a conversation by how they arrived ({"native": 3, "hermes": 1}; empty: no calls)."""
    counts: dict[str, int] = {}
    for m in messages:
        if m.get("role") != "assistant":
            continue
        calls = m.get("tool_calls") or []
        formats = m.get(ARRIVAL_KEY) or ["native"] * len(calls)
        for fmt in formats[:len(calls)]:
            counts[fmt] = counts.get(fmt, 0) + 1
    return dict(sorted(counts.items()))
