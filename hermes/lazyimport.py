"""Modules imported on first use, under one lock.

A run that never streams, looks at an image or draws one has no use for the openai SDK, whose
import was 0.7 s of every run's start (`python -X importtime`). Parallel tool calls, or the API
server's request threads, would otherwise import such a module in several threads at once, and
one of them could find it half-initialised ("partially initialized module 'httpx' has no
attribute 'URL'").
"""
from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Any, Callable

_importing = threading.RLock()  # a module imported so may itself import one so


def imported(name: str) -> ModuleType:
    with _importing:
        return importlib.import_module(name)


def lazy_surface(package: str, public: dict[str, str]) -> tuple[Callable[[str], Any], list[str]]:
    """A package's public surface, each name imported from its submodule on first use (PEP 562):
    `__getattr__, __all__ = lazy_surface(__name__, {"RunSession": "session", ...})`. Importing the
    package stays free, and no submodule pays for its siblings."""
    def __getattr__(name: str) -> Any:
        if name not in public:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(imported(f"{package}.{public[name]}"), name)

    return __getattr__, sorted(public)
