"""A toolset of the tests' own, not shipped: what adding a toolset takes (this module, and the
one line that imports it -- here HERMES_TOOLSET_MODULES=tests.example_toolset, in the product a
line in hermes/tools/__init__.py).

It declares its tools, its settings (a CLI flag --echo_prefix, a section of the Prefect form),
that it needs no sandbox, and when it is available (a secret, ECHO_TOKEN, is set). It also adds
a distribution that draws it. Each call reports when it ran, so tests can see calls overlap.
"""
from __future__ import annotations

import time

from pydantic import BaseModel, Field

from hermes.data import distributions
from hermes.tools.registry import Tool, Toolset, register

PARAMETERS = {"type": "object", "properties": {
    "text": {"type": "string", "description": "what to echo"},
    "sleep": {"type": "number", "description": "seconds to wait first"}}, "required": ["text"]}


class EchoSettings(BaseModel):
    prefix: str = Field("", description="put before every echo")


def run_echo(ctx, args: dict) -> dict:
    started = time.time()
    time.sleep(min(float(args.get("sleep") or 0), 10))
    return {"echo": ctx.settings.prefix + args["text"], "started": started, "ended": time.time(),
            "token_seen": ctx.secret("ECHO_TOKEN") is not None, "call_id": ctx.call_id}


def token_set(settings: EchoSettings, secret) -> str | None:
    return None if secret("ECHO_TOKEN") else "ECHO_TOKEN is not set"


register(Toolset(
    name="echo", settings=EchoSettings, needs_sandbox=False, available=token_set,
    description="echo text back (a test toolset)",
    tools=[Tool(name="echo", description="Echo text back.", parameters=PARAMETERS, run=run_echo),
           Tool(name="echo_alone", description="Echo text back, never beside another call.",
                parameters=PARAMETERS, run=run_echo, exclusive=True)]))

distributions.register("echo_only", {"echo": 100})
