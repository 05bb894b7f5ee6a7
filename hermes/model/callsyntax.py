"""Tool calls written as text in a syntax other than JSON: XML elements and Python calls.

hermes.model.textcalls finds where calls are and decides which count; this module only reads the
two shapes whose grammar is not JSON's, so the parser there stays about markers and rules:

* XML inside `<tools>...</tools>`, as Qwen2.5-Coder writes it when the tool list in its prompt
  was XML-ish (recorded in tests/model/recorded/real_qwen25coder_tools_tag_*.json):
  `<function name="X" arguments='{...}'/>`, `<function><name>X</name><arguments><k>v</k>
  </arguments></function>`, `<function=X>{...}</function>` or `<function=X><k>v</k></function>`.
  Read with patterns, not an XML parser: a model's XML is rarely well formed (a `&&` or `<` in a
  command, an invented `<output>` child, a `\\$` in an attribute) and a call in it is still a call.
* Python calls, `[terminal(command="ls"), read_file(path="a")]` (Llama 3.2/4's "pythonic" format,
  vLLM's and SGLang's `pythonic` parser): read by `ast`, literals only, never evaluated.

It also holds how any call's arguments become the JSON text a native call carries (encode_arguments).
Each reader returns (name, arguments) pairs, arguments a dict or the raw text the model wrote (the
caller encodes them; text that is not a JSON object gets the tool's "Invalid JSON arguments"),
or None when the text is not wholly calls of that shape.
"""
from __future__ import annotations

import ast
import bisect
import json
import re
from typing import Any

Call = tuple[str, Any]
PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"

_ATTR = re.compile(r"""([A-Za-z_][\w.-]*)\s*=\s*("[^"]*"|'[^']*')""")
# an opening tag: `<function=NAME>`, or `<function` with quoted attributes (which may hold `>`), or bare
_OPEN = re.compile(r"""<function(?:=([^>\s]+)\s*>|((?:\s+[A-Za-z_][\w.-]*\s*=\s*(?:"[^"]*"|'[^']*'))*)\s*(/?)>)""")
_CLOSE = "</function>"
_TAG = re.compile(r"<(/?)([A-Za-z_][\w.-]*)\s*(/?)>")
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


def encode_arguments(value: Any) -> str:
    """A call's arguments as the JSON text a native call carries. A model that wrote its arguments as a
    JSON-encoded string (`"arguments": "{\\"path\\": ...}"`) meant the object inside: decoded."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        try:
            inner = json.loads(value)
        except ValueError:
            return value  # not JSON: run_tool answers "Invalid JSON arguments", which the model can read
        return json.dumps(inner, ensure_ascii=False) if isinstance(inner, dict) else value
    return json.dumps(value, ensure_ascii=False)


def native_arguments(arguments: Any) -> Any:
    """A native call's arguments, a JSON-encoded string inside its JSON decoded; otherwise as sent."""
    if isinstance(arguments, str) and arguments.lstrip().startswith('"'):
        try:
            inner = json.loads(arguments)
        except ValueError:
            return arguments
        if isinstance(inner, str):
            decoded = encode_arguments(inner)
            if decoded.startswith("{"):
                return decoded
    return arguments


def typed_value(raw: str, kind: Any) -> Any:
    """A value written as text, as the tool's schema types it: a string unless the schema says
    otherwise, then read as JSON where it is (as vLLM's qwen3_coder parser does)."""
    if kind in (None, "string"):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # kept as text: the tool's argument check says what is wrong


def element_text(raw: str) -> str:
    """A value between tags, without the line break after the opening tag and the indented line
    break before the closing one (`<k>\\n  v\\n</k>` holds "  v"; `<k>v</k>` holds "v")."""
    if not raw.strip():
        return ""
    raw = raw[1:] if raw.startswith("\n") else raw
    return re.sub(r"\n[ \t]*\Z", "", raw)


def parameters(body: str, properties: dict[str, Any]) -> dict[str, Any]:
    """Qwen3-coder's `<parameter=K>value</parameter>...`, each value typed by the schema, less the
    one line break its template writes after the opening tag and before the closing one."""
    args: dict[str, Any] = {}
    for key, raw in _PARAMETER.findall(body):
        value = raw[1:] if raw.startswith("\n") else raw
        value = value[:-1] if value.endswith("\n") else value
        args[key] = typed_value(value, (properties.get(key) or {}).get("type"))
    return args


def _children(body: str) -> dict[str, str] | None:
    """The child elements `<k>v</k>` (or `<k/>`) of `body`, the first of each name, what they hold
    taken whole; None when it has none. One pass over the tags, each opening one paired with the
    first closing one of its name after it: an answer full of unclosed tags (`<br>`) costs no more
    than the tags themselves (a pattern with a back-reference rescanned the rest for each)."""
    tags = list(_TAG.finditer(body))
    closing: dict[str, list[int]] = {}
    for i, tag in enumerate(tags):
        if tag.group(1):
            closing.setdefault(tag.group(2), []).append(i)
    found: dict[str, str] = {}
    i = 0
    while i < len(tags):
        tag = tags[i]
        i += 1
        if tag.group(1):
            continue  # a closing tag left over
        if tag.group(3):
            found.setdefault(tag.group(2), "")
            continue
        ends = closing.get(tag.group(2), [])
        j = bisect.bisect_left(ends, i)
        if j < len(ends):  # else never closed: not an element
            found.setdefault(tag.group(2), body[tag.end():tags[ends[j]].start()])
            i = ends[j] + 1  # what it holds is its own, not more children
    return found or None


def _arguments(body: str, properties: dict[str, Any]) -> Any:
    """Arguments written between tags: a JSON object, `<parameter=K>`s, or one child element per
    argument; empty: none; anything else is kept as text (the tool answers it is not JSON)."""
    text = body.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            return text
        return value if isinstance(value, dict) else text
    if "<parameter=" in text:
        return parameters(text, properties)
    children = _children(text)
    if children is None:
        return text
    return {k: typed_value(element_text(v), (properties.get(k) or {}).get("type")) for k, v in children.items()}


def _attribute(value: str) -> str:
    return value[1:-1]


def xml_calls(body: str, schemas: dict[str, dict]) -> list[Call] | None:
    """The calls in the body of a `<tools>` block written as `<function>` elements; None unless
    every element is a call: a name and arguments (a `<function=NAME>` carries them), and no
    description (a tool list echoed back as XML describes its tools, it does not call them)."""
    calls: list[Call] = []
    closes = [m.start() for m in re.finditer(re.escape(_CLOSE), body)]
    at = 0
    while True:
        m = _OPEN.search(body, at)
        if m is None:
            break
        inline_name, attrs_text, closed = m.group(1), m.group(2), m.group(3)
        end = m.end() if closed else _element_end(body, m.end(), closes)
        inner = "" if closed else body[m.end():end]
        at = end + len(_CLOSE) if body.startswith(_CLOSE, end) else end
        attrs = {k: _attribute(v) for k, v in _ATTR.findall(attrs_text or "")}
        children = _children(inner) or {}
        if "description" in attrs or "description" in children:
            return None
        name = (inline_name or attrs.get("name") or element_text(children.get("name", ""))).strip()
        if not name:
            return None
        properties = ((schemas.get(name) or {}).get("parameters") or {}).get("properties") or {}
        if inline_name is not None:
            calls.append((name, _arguments(inner, properties)))
            continue
        written = attrs.get("arguments", attrs.get("parameters"))
        if written is None:
            key = "arguments" if "arguments" in children else "parameters" if "parameters" in children else None
            if key is None:
                return None  # a name alone is a record, not a call
            calls.append((name, _arguments(children[key], properties)))
        else:
            calls.append((name, written))  # the attribute's text: JSON, or kept raw for the tool's error
    return calls or None


def _element_end(body: str, start: int, closes: list[int]) -> int:
    """Where an element opened at `start` ends: its `</function>` (`closes`: where each is), else the
    next `<function` (a model that never closed it), else the end of the block."""
    j = bisect.bisect_left(closes, start)
    close = closes[j] if j < len(closes) else len(body)
    nxt = _OPEN.search(body, start, close)
    return nxt.start() if nxt is not None else close


def python_calls(text: str) -> list[Call] | None:
    """`[name(key=literal, ...), ...]`, the whole of `text`: the calls; None for anything else
    (a positional argument, a name that is not a plain identifier, a value that is not a literal)."""
    text = text.strip()  # Llama 4 wraps it in <|python_start|>...<|python_end|>
    text = text[len(PYTHON_START):] if text.startswith(PYTHON_START) else text
    text = text[:-len(PYTHON_END)].strip() if text.endswith(PYTHON_END) else text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls: list[Call] = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        args: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:  # **kwargs
                return None
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
        try:
            json.dumps(args)
        except (TypeError, ValueError):  # a set, bytes, a complex number: no JSON argument is one
            return None
        calls.append((node.func.id, args))
    return calls
