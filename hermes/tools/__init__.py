"""The tool registry: every tool the system has, its toolset, its JSON schema and run().

    tools = tools_for(["terminal", "file"])
    schemas = openai_schemas(tools)                     # -> the model request's `tools`
    result = run_tool(call.name, call.arguments, sb)    # -> JSON string, never raises

A tool's `run(sandbox, args)` receives arguments that `run_tool` has already parsed and
checked against the schema (required parameters present, types right, enums respected,
nulls for optional parameters dropped) and returns a JSON string.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from hermes.tools import files as _files
from hermes.tools import terminal as _terminal
from hermes.tools._common import dumps, error

__all__ = ["Tool", "TOOLS", "TOOLSETS", "tools_for", "openai_schemas", "run_tool", "validate_arguments"]


@dataclass(frozen=True)
class Tool:
    name: str
    toolset: str
    description: str
    parameters: dict = field(hash=False, compare=False)
    run: Callable[[Any, dict], str] = field(hash=False, compare=False, repr=False)

    @property
    def required(self) -> list[str]:
        return list(self.parameters.get("required", []))

    def openai_schema(self) -> dict:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


TOOLS: dict[str, Tool] = {spec["name"]: Tool(**spec) for spec in (*_terminal.TOOL_SPECS, *_files.TOOL_SPECS)}

TOOLSETS: dict[str, list[str]] = {}
for _tool in TOOLS.values():
    TOOLSETS.setdefault(_tool.toolset, []).append(_tool.name)
del _tool


def tools_for(toolsets: Iterable[str]) -> list[Tool]:
    """The tools of these toolsets, in registry order; toolsets with no tools here are ignored."""
    wanted = set(toolsets)
    return [tool for tool in TOOLS.values() if tool.toolset in wanted]


def openai_schemas(tools: Iterable[Tool]) -> list[dict]:
    return [tool.openai_schema() for tool in tools]


# --------------------------------------------------------------------------- validation

_TYPE_NAMES = {"string": "a string", "integer": "an integer", "number": "a number",
               "boolean": "a boolean", "object": "an object", "array": "an array"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _coerce(value: Any, expected: str) -> tuple[bool, Any]:
    """(ok, value): accept the value as `expected`, allowing only lossless conversions
    models commonly make (5.0 or "5" for an integer, "true" for a boolean)."""
    actual = _json_type(value)
    if actual == expected or (expected == "number" and actual == "integer"):
        return True, value
    if expected == "integer":
        if actual == "number" and float(value).is_integer():
            return True, int(value)
        if actual == "string" and value.strip().lstrip("+-").isdigit():
            return True, int(value.strip())
    if expected == "number" and actual == "string":
        try:
            return True, float(value)
        except ValueError:
            return False, value
    if expected == "boolean" and actual == "string" and value.strip().lower() in ("true", "false"):
        return True, value.strip().lower() == "true"
    return False, value


def validate_arguments(tool: Tool, args: dict) -> tuple[dict | None, str | None]:
    """(clean args, None) or (None, error message naming the parameter)."""
    props: dict = tool.parameters.get("properties", {})
    clean = {k: v for k, v in args.items() if not (v is None and k not in tool.required)}
    for name in tool.required:
        if clean.get(name) is None:
            return None, f"Missing required parameter '{name}' for tool '{tool.name}'"
    for name, value in list(clean.items()):
        schema = props.get(name)
        if schema is None:
            continue  # extra parameters are ignored, as models add them freely
        expected = schema.get("type")
        if expected:
            ok, value = _coerce(value, expected)
            if not ok:
                return None, (f"Parameter '{name}' of tool '{tool.name}' must be "
                              f"{_TYPE_NAMES.get(expected, expected)}, got {_json_type(clean[name])}")
            clean[name] = value
        if "enum" in schema and value not in schema["enum"]:
            allowed = ", ".join(repr(v) for v in schema["enum"])
            return None, f"Parameter '{name}' of tool '{tool.name}' must be one of {allowed}, got {value!r}"
    return clean, None


# --------------------------------------------------------------------------- dispatch

def run_tool(name: str, arguments: str | dict | None, sandbox: Any) -> str:
    """Run one model tool call in `sandbox`. Always returns a JSON string; never raises."""
    try:
        tool = TOOLS.get(name) if isinstance(name, str) else None
        if tool is None:
            return error(f"Unknown tool: {name}")
        if isinstance(arguments, dict):
            args: Any = arguments
        elif arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            args = {}
        else:
            try:
                args = json.loads(arguments)
            except (TypeError, ValueError) as exc:
                return error(f"Invalid JSON arguments: {exc}")
        if not isinstance(args, dict):
            return error(f"Invalid JSON arguments: expected an object, got {_json_type(args)}")
        clean, problem = validate_arguments(tool, args)
        if problem:
            return error(problem)
        result = tool.run(sandbox, clean)
        if isinstance(result, str):
            return result
        return dumps(result)
    except Exception as exc:  # a tool bug or a dead sandbox must not end the prompt's run
        return error(f"{type(exc).__name__}: {exc}")
