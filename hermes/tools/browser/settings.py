"""The browser toolset's settings (flags --browser_<field>) and whether it can run here."""
from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
from typing import Callable, Literal

from pydantic import BaseModel, Field

#: the reference's variable: a remote browser's CDP endpoint (ws:// or http://). Read as a secret,
#: never stored in settings: hosted browsers put their API key in this URL.
CDP_ENV = "BROWSER_CDP_URL"
#: the unprivileged account the local Chromium runs as when we are root (bootstrap.sh creates it)
DEDICATED_USER = "hermes-browser"
EXECUTABLES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserSettings(BaseModel):
    backend: Literal["auto", "local", "cdp"] = Field(
        "auto", description="auto: the remote browser of BROWSER_CDP_URL when set, else a local Chromium; "
                            "local: Chromium on this machine; cdp: the remote browser of BROWSER_CDP_URL")
    executable: str = Field("", description="the local Chromium binary (default: chromium on PATH)")
    user: str = Field("", description=f"account the local Chromium runs as when hermes runs as root "
                                      f"(default: {DEDICATED_USER} if it exists, else nobody)")
    timeout: float = Field(30.0, gt=0, le=600, description="seconds one browser tool call may take; a page that "
                                                           "hangs or loops is cut off then")
    max_contexts: int = Field(4, ge=1, le=64, description="browser contexts (prompts browsing) live at once in "
                                                          "this process; more prompts wait for a free one")
    context_wait: float = Field(300.0, gt=0, description="seconds a prompt waits for a free browser context")
    snapshot_chars: int = Field(12000, ge=500, le=200_000, description="characters of a snapshot; a longer one "
                                                                       "is cut with a footer that says so")
    launch_timeout: float = Field(30.0, gt=0, le=300, description="seconds to start or connect to the browser")


def resolve_executable(settings: BrowserSettings) -> str | None:
    if settings.executable:
        return shutil.which(settings.executable) or (settings.executable if os.access(settings.executable, os.X_OK) else None)
    return next((p for p in (shutil.which(n) for n in EXECUTABLES) if p), None)


def browser_user(settings: BrowserSettings) -> str | None:
    """The account to run Chromium as; None: run as ourselves (we are not root)."""
    if os.geteuid() != 0:
        return None
    if settings.user:
        return settings.user
    try:
        pwd.getpwnam(DEDICATED_USER)
        return DEDICATED_USER
    except KeyError:
        return "nobody"


def use_cdp(settings: BrowserSettings, secret: Callable[[str], str | None]) -> bool:
    return settings.backend == "cdp" or (settings.backend == "auto" and bool(secret(CDP_ENV)))


def available(settings: BrowserSettings | None, secret: Callable[[str], str | None]) -> str | None:
    settings = settings or BrowserSettings()
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install playwright; bash deployments/bootstrap.sh)"
    if use_cdp(settings, secret):
        return None if secret(CDP_ENV) else f"--browser_backend=cdp needs {CDP_ENV} (a CDP endpoint URL)"
    if resolve_executable(settings) is None:
        return ("no local Chromium found (apt-get install chromium, or bash deployments/bootstrap.sh; "
                f"or set {CDP_ENV} to a remote browser)")
    user = browser_user(settings)
    if user is not None:
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"--browser_user {user!r} does not exist on this machine"
        if user == "root":
            return "the local Chromium must not run as root; choose another --browser_user"
    return None
