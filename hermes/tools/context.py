"""What a tool call gets besides its arguments.

One `ToolContext` is made per prompt (or API request) by the code that runs the conversation;
each call sees it through a `CallContext`, which adds the call's id and its own toolset's settings:

    ctx.sandbox        the prompt's sandbox, opened on first use (tools that declare needs_sandbox)
    ctx.settings       this toolset's settings (hermes.tools.registry.Toolset.settings), or None
    ctx.secret(NAME)   an API key or token: the environment, or what the caller backs it with
    ctx.endpoint       the run's own model endpoint (base_url, model, api_key): auxiliary models default to it
    ctx.run_dir        the run folder (None outside batch runs): files a tool produces go beside the journal
    ctx.key, ctx.call_id    the prompt's content key and this call's id (name produced files by them)
    ctx.net            where model-chosen URLs may go (hermes.netpolicy.NetPolicy): check every URL and redirect
    ctx.shared         process-wide objects (HTTP clients, a browser) made once: shared.get(name, factory)
    ctx.prompt_state   per-prompt objects (a browser context); ctx.on_close(fn) closes them at prompt end
    ctx.record_usage(kind, usage)   token usage of auxiliary model calls, counted apart from the agent's
    ctx.add_file(path)              a file the call produced, recorded in the journal entry
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hermes.environment import read
from hermes.netpolicy import NetPolicy

log = logging.getLogger(__name__)


def env_secret(name: str) -> str | None:
    """The default secret lookup: the process environment (an empty value counts as unset)."""
    return os.environ.get(name) or None


@dataclass(frozen=True)
class ModelEndpoint:
    """The agent's own OpenAI-compatible endpoint; vision and image tools default to it."""

    base_url: str
    model: str
    api_key: str | None = None


class SharedResources:
    """Objects a process makes once and every prompt reuses (a connection pool, a browser).

    Closed when the run (or server) ends: objects with close() are closed in reverse order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, Any] = {}
        self._building: dict[str, threading.Lock] = {}

    def get(self, name: str, factory: Callable[[], Any]) -> Any:
        with self._lock:
            if name in self._items:
                return self._items[name]
            building = self._building.setdefault(name, threading.Lock())
        with building:  # one factory call per name, without holding the registry lock while it runs
            with self._lock:
                if name in self._items:
                    return self._items[name]
            value = factory()
            with self._lock:
                self._items[name] = value
            return value

    def peek(self, name: str) -> Any:
        with self._lock:
            return self._items.get(name)

    def discard(self, name: str) -> Any:
        with self._lock:
            return self._items.pop(name, None)

    def close(self) -> None:
        with self._lock:
            items, self._items = list(self._items.items()), {}
        for name, item in reversed(items):
            close = getattr(item, "close", None)
            if callable(close):
                try:
                    close()
                except Exception as e:  # noqa: BLE001 - closing one must not skip the others
                    log.warning("closing shared %s failed: %s", name, e)


class NoSandbox:
    """Stands in where a conversation has no sandbox: a tool that needs one says so clearly."""

    command_timeout = None

    def _refuse(self, *a: Any, **k: Any) -> Any:
        from hermes.sandbox.base import SandboxError

        raise SandboxError("this tool needs a sandbox, and this conversation has none")

    exec = read_file = write_file = _refuse


@dataclass
class ToolContext:
    sandbox: Any = field(default_factory=NoSandbox)
    settings: Any = None                     # the combined toolset settings (registry.toolset_settings_model())
    secret: Callable[[str], str | None] = env_secret
    endpoint: ModelEndpoint | None = None
    run_dir: Path | None = None
    key: str = ""
    net: NetPolicy = field(default_factory=lambda: NetPolicy.from_hosts(read("web_allow_hosts")))
    shared: SharedResources = field(default_factory=SharedResources)
    prompt_state: dict[str, Any] = field(default_factory=dict)
    aux_usage: dict[str, dict[str, int]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    #: the tools this conversation was offered (None: any registered tool); a call to another is refused
    offered: frozenset[str] | None = None
    _closers: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def for_call(self, toolset: str, call_id: str = "") -> "CallContext":
        from hermes.tools.registry import settings_of

        return CallContext(self, settings_of(self.settings, toolset), call_id)

    def record_usage(self, kind: str, usage: dict[str, Any] | None) -> None:
        """Add an auxiliary model call's token usage under `kind` (e.g. "vision")."""
        with self._lock:
            into = self.aux_usage.setdefault(kind, {"calls": 0})
            into["calls"] += 1
            for k, v in (usage or {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    into[k] = into.get(k, 0) + int(v)

    def add_file(self, path: str | Path) -> str:
        """Record a produced file; returns its path relative to the run folder when inside it."""
        p = Path(path)
        shown = str(p.relative_to(self.run_dir)) if self.run_dir and p.is_relative_to(self.run_dir) else str(p)
        with self._lock:
            self.files.append(shown)
        return shown

    def on_close(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._closers.append(fn)

    def close(self) -> None:
        """End of the prompt: close what its tools opened (newest first), however the prompt ended."""
        with self._lock:
            closers, self._closers = self._closers[::-1], []
        for fn in closers:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - one failing closer must not skip the rest
                log.warning("closing a tool's per-prompt state failed: %s", e)


class CallContext:
    """One tool call's view of its prompt's ToolContext."""

    __slots__ = ("prompt", "settings", "call_id")

    def __init__(self, prompt: ToolContext, settings: Any, call_id: str):
        self.prompt = prompt
        self.settings = settings
        self.call_id = call_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self.prompt, name)
