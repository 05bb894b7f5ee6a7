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

_importing = threading.RLock()  # a module imported so may itself import one so


def imported(name: str) -> ModuleType:
    with _importing:
        return importlib.import_module(name)
