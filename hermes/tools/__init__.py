"""Every tool the system has, by toolset, and the one place a model's tool call is run.

    tools = tools_for(["terminal", "file"])
    schemas = openai_schemas(tools)                   # -> the model request's `tools`
    result = run_tool(call.name, call.arguments, ctx) # -> JSON string, never raises

Toolsets register themselves (hermes/tools/registry.py); adding one is a module plus one import
line below. `ctx` is the prompt's hermes.tools.context.ToolContext (a bare sandbox is accepted
too, for callers that only have one). A tool's `run(ctx, args)` receives arguments already parsed
and checked against its schema (required parameters present, types right, enums respected,
nulls for optional parameters dropped) and returns a JSON string or a JSON-able value.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# Toolsets: importing a module registers it. Keep this the only list of them.
from hermes.tools import terminal as _terminal  # noqa: F401
from hermes.tools import files as _files  # noqa: F401
from hermes.tools import web as _web  # noqa: F401
from hermes.tools import vision as _vision  # noqa: F401 - before browser, whose browser_vision uses it
from hermes.tools import browser as _browser  # noqa: F401
from hermes.tools import image_gen as _image_gen  # noqa: F401

from hermes.tools.registry import load_plugins

load_plugins()  # toolsets of the user's own, named by HERMES_TOOLSET_MODULES

from hermes.tools._common import dumps, error
from hermes.tools.context import CallContext, ModelEndpoint, SharedResources, ToolContext, env_secret
from hermes.tools.registry import (
    Tool,
    Toolset,
    availability,
    get_tool,
    needs_sandbox,
    openai_schemas,
    register,
    tools,
    tools_for,
    toolset_settings_model,
    toolsets,
    usable_toolsets,
)
from hermes.tools.validation import _json_type, validate_arguments

__all__ = ["Tool", "Toolset", "TOOLS", "TOOLSETS", "ToolContext", "CallContext", "ModelEndpoint", "SharedResources",
           "register", "tools_for", "openai_schemas", "needs_sandbox", "run_tool", "validate_arguments",
           "toolset_settings_model", "usable_toolsets", "availability", "env_secret", "get_tool", "toolsets",
           "all_tool_names"]

#: live views of the registry: tool name -> Tool, toolset name -> its tool names
TOOLS = tools()


class _ToolsetNames(Mapping):
    """toolset name -> its tool names, always current (tests may register example toolsets)."""

    def __getitem__(self, name: str) -> list[str]:
        return [t.name for t in toolsets()[name].tools]

    def __iter__(self):
        return iter(toolsets())

    def __len__(self) -> int:
        return len(toolsets())

    def __repr__(self) -> str:
        return repr(dict(self))


TOOLSETS = _ToolsetNames()


def all_tool_names() -> list[str]:
    """Every registered tool, sorted: the columns of every entry's tool_stats."""
    return sorted(tools())


def run_tool(name: str, arguments: str | dict | None, ctx: Any, call_id: str = "") -> str:
    """Run one model tool call. Always returns a JSON string; never raises."""
    try:
        tool = get_tool(name)
        offered = ctx.offered if isinstance(ctx, ToolContext) else None
        if tool is None or (offered is not None and name not in offered):
            # A registered tool the conversation was not offered is as unknown to it as an invented one.
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
        if not isinstance(ctx, ToolContext):
            ctx = ToolContext(sandbox=ctx)
        result = tool.run(ctx.for_call(tool.toolset, call_id), clean)
        if isinstance(result, str):
            return result
        return dumps(result)
    except Exception as exc:  # a tool bug or a dead sandbox must not end the prompt's run
        return error(f"{type(exc).__name__}: {exc}")
