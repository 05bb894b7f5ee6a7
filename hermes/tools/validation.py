"""Tool-call arguments checked against the tool's JSON schema, with the lossless conversions models need."""
from __future__ import annotations

from typing import Any


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


def validate_arguments(tool: Any, args: dict) -> tuple[dict | None, str | None]:
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
