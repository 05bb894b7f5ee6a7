"""The tool registry: toolsets register themselves; everything else asks the registry.

A toolset is one module that builds a `Toolset` (its tools, its settings model, whether it is
available here and why not) and passes it to `register()`; `hermes/tools/__init__.py` imports
each toolset module once. Nothing outside a toolset's module knows its name:

    from hermes.tools.registry import Tool, Toolset, register

    class EchoSettings(BaseModel):
        prefix: str = Field("", description="put before every echo")

    def run_echo(ctx, args):                      # ctx: hermes.tools.context.CallContext
        return {"echo": ctx.settings.prefix + args["text"]}

    register(Toolset(name="echo", settings=EchoSettings, needs_sandbox=False,
                     tools=[Tool(name="echo", description="...", parameters={...}, run=run_echo)]))

The settings of every registered toolset form one model (`toolset_settings_model()`), which the
run settings carry as `tools`: the CLI gets a `--<prefix>_<field>` flag per field, the Prefect
form a section per toolset. Secrets (API keys) are never settings: a toolset reads them through
`ctx.secret(NAME)`, which the caller backs with the environment (or a Prefect Secret block).
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, create_model

from hermes.errors import HermesError
from hermes.environment import read

log = logging.getLogger(__name__)

#: a toolset's answer to "can you run here?": None when it can, else the reason it cannot
Availability = Callable[[Any, Callable[[str], str | None]], str | None]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict = field(hash=False, compare=False)
    #: run(ctx, args) -> JSON string or a JSON-able value; args are already checked against `parameters`
    run: Callable[[Any, dict], Any] = field(hash=False, compare=False, repr=False)
    toolset: str = ""                   # filled in by the Toolset that holds it
    needs_sandbox: bool | None = None   # None: as its toolset says
    #: must not run at the same time as another call of the same assistant turn
    exclusive: bool = False

    @property
    def required(self) -> list[str]:
        return list(self.parameters.get("required", []))

    def openai_schema(self) -> dict:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class Toolset:
    name: str
    tools: tuple[Tool, ...] | list[Tool]
    #: a pydantic model of the toolset's own settings (backend, limits, endpoints; never keys)
    settings: type[BaseModel] | None = None
    #: CLI flags are --<flag_prefix>_<field>; default: the toolset's name
    flag_prefix: str | None = None
    #: do its tools run in the prompt's sandbox? (web, vision... run in the orchestrator)
    needs_sandbox: bool = True
    #: (its settings, secret lookup) -> None when usable here, else why not
    available: Availability | None = None
    description: str = ""

    def __post_init__(self) -> None:
        tools = tuple(replace(t, toolset=self.name,
                              needs_sandbox=self.needs_sandbox if t.needs_sandbox is None else t.needs_sandbox)
                      for t in self.tools)
        object.__setattr__(self, "tools", tools)

    @property
    def prefix(self) -> str:
        return self.flag_prefix or self.name

    def unavailable_reason(self, settings: Any, secret: Callable[[str], str | None]) -> str | None:
        if self.available is None:
            return None
        try:
            return self.available(settings, secret)
        except Exception as e:  # a broken probe must say so, not take the run down
            return f"availability check failed: {type(e).__name__}: {e}"


_TOOLSETS: dict[str, Toolset] = {}
_TOOLS: dict[str, Tool] = {}
_settings_model: type[BaseModel] | None = None


class RegistryError(HermesError, ValueError):
    pass


def register(toolset: Toolset) -> Toolset:
    """Add a toolset; its tool names must be new. Register before the settings model is built."""
    if toolset.name in _TOOLSETS:
        raise RegistryError(f"toolset '{toolset.name}' is registered twice")
    for tool in toolset.tools:
        if tool.name in _TOOLS:
            raise RegistryError(f"tool '{tool.name}' of toolset '{toolset.name}' is already registered "
                                f"by toolset '{_TOOLS[tool.name].toolset}'")
    if _settings_model is not None and toolset.settings is not None:
        raise RegistryError(f"toolset '{toolset.name}' registered after the settings model was built; "
                            "import it from hermes/tools/__init__.py")
    _TOOLSETS[toolset.name] = toolset
    for tool in toolset.tools:
        _TOOLS[tool.name] = tool
    return toolset


def unregister(name: str) -> None:
    """Remove a toolset that has no settings (tests register example toolsets and remove them)."""
    toolset = _TOOLSETS.pop(name)
    for tool in toolset.tools:
        _TOOLS.pop(tool.name, None)


def toolsets() -> Mapping[str, Toolset]:
    return _TOOLSETS


def tools() -> Mapping[str, Tool]:
    return _TOOLS


def get_tool(name: str) -> Tool | None:
    return _TOOLS.get(name) if isinstance(name, str) else None


def tools_for(names: Iterable[str]) -> list[Tool]:
    """The tools of these toolsets, in registry order; unknown toolsets are ignored."""
    wanted = set(names)
    return [tool for tool in _TOOLS.values() if tool.toolset in wanted]


def openai_schemas(tools: Iterable[Tool]) -> list[dict]:
    return [tool.openai_schema() for tool in tools]


def needs_sandbox(tools: Iterable[Tool]) -> bool:
    return any(tool.needs_sandbox for tool in tools)


def toolset_settings_model() -> type[BaseModel]:
    """One field per registered toolset that has settings (built once, on first use)."""
    global _settings_model
    if _settings_model is None:
        fields: dict[str, Any] = {
            ts.name: (ts.settings, Field(default_factory=ts.settings, description=ts.description or f"{ts.name} toolset"))
            for ts in _TOOLSETS.values() if ts.settings is not None
        }
        _settings_model = create_model("ToolsetSettings", __config__=ConfigDict(extra="forbid"), **fields)
        _settings_model.__doc__ = "Settings of each toolset (backends, endpoints, limits; never API keys)."
    return _settings_model


def settings_of(all_settings: Any, toolset: str) -> Any:
    """The toolset's own settings out of the combined model (None for a toolset without any)."""
    return getattr(all_settings, toolset, None) if all_settings is not None else None


def availability(all_settings: Any, secret: Callable[[str], str | None]) -> dict[str, str | None]:
    """toolset name -> None (usable here) or the reason it is not."""
    return {name: ts.unavailable_reason(settings_of(all_settings, name), secret) for name, ts in _TOOLSETS.items()}


def usable_toolsets(all_settings: Any, secret: Callable[[str], str | None], wanted: Iterable[str] | None = None,
                    *, warn: bool = True) -> list[str]:
    """The toolsets (of `wanted`, default all) that can run here; warns once per one left out."""
    reasons = availability(all_settings, secret)
    names = list(_TOOLSETS) if wanted is None else list(wanted)
    usable = []
    for name in names:
        if name not in reasons:
            continue
        if reasons[name] is None:
            usable.append(name)
        elif warn:
            log.warning("toolset '%s' is not available here and is left out: %s", name, reasons[name])
    return usable


#: comma list of importable modules that register toolsets of the user's own (and, if they
#: like, distributions that draw them: hermes.data.distributions.register)
PLUGINS_ENV = "HERMES_TOOLSET_MODULES"


def load_plugins() -> list[str]:
    names = read("toolset_modules")
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:
            raise RegistryError(f"{PLUGINS_ENV}: cannot import toolset module '{name}': {type(e).__name__}: {e}") from e
    return names
