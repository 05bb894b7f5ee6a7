"""One prompt, start to finish: sandbox, agent loop, trajectory entry, journal line.

Also one batch: its prompts run concurrently, bounded by a run-wide limiter so that
--num_workers counts prompts in flight across all batches.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from hermes import distributions, journal
from hermes.agent import compose_system_prompt, run_agent
from hermes.dataset import Row
from hermes.model import ModelClient
from hermes.requeue import RequeueingPool, RetryPolicy
from hermes.sandbox import open_sandbox
from hermes.sandbox.base import SandboxError, SandboxSpec
from hermes.sandbox.docker import ensure_image
from hermes.sandbox.lazy import LazySandbox
from hermes.sandbox.lifecycle import raise_if_stopping
from hermes.settings import RunSettings
from hermes.stats import entry_tool_stats, hallucinated_tools, has_any_reasoning, reasoning_counts
from hermes.tools import TOOLS, TOOLSETS, openai_schemas, tools_for
from hermes.trajectory import to_sharegpt

log = logging.getLogger(__name__)
ALL_TOOL_NAMES = sorted(TOOLS)


@dataclass
class RunContext:
    """What every prompt of one run shares. Built once per process."""

    settings: RunSettings
    run_id: str
    run_dir: Path
    client: ModelClient
    distribution: dict[str, int]
    prefill: list[dict[str, Any]] = field(default_factory=list)
    limiter: threading.Semaphore | None = None
    on_prompt_done: Callable[[dict[str, Any]], None] | None = None

    @classmethod
    def create(cls, settings: RunSettings, run_id: str, *, api_key: str | None = None, **kw) -> "RunContext":
        prefill = load_prefill(settings.prefill_messages_file)
        dist = distributions.usable(settings.distribution, set(TOOLSETS))
        run_dir = Path(settings.output_dir) / settings.run_name
        return cls(settings=settings, run_id=run_id, run_dir=run_dir, client=ModelClient(settings, api_key),
                   distribution=dist, prefill=prefill, **kw)


def load_prefill(path: str | None) -> list[dict[str, Any]]:
    if not path:
        return []
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"--prefill_messages_file {path}: {e}") from e
    if not isinstance(data, list) or not all(isinstance(m, dict) and "role" in m for m in data):
        raise ValueError(f"--prefill_messages_file {path}: expected a JSON array of messages with a 'role'")
    return data


def run_prompt(row: Row, batch_num: int, ctx: RunContext) -> dict[str, Any]:
    """Run one prompt to an entry: the reference's trajectory fields plus a `hermes` block."""
    s = ctx.settings
    started = time.monotonic()
    toolsets = distributions.sample(ctx.distribution, s.seed, row.key)
    tools = openai_schemas(tools_for(toolsets))
    image = row.row.container_image or s.sandbox.image
    spec = SandboxSpec(image=image, cwd=row.row.cwd,
                       labels={"hermes-batch.run": ctx.run_id, "hermes-batch.prompt": str(row.index)})
    preview = row.row.prompt[: s.log_prefix_chars].replace("\n", " ")
    log.debug("prompt %d started: %s", row.index, preview)
    error = None
    run = None
    box = None
    try:
        raise_if_stopping(ctx.run_id)  # an interrupted run starts no more prompts
        if s.sandbox.backend == "docker":
            ensure_image(image, s.sandbox.pull_timeout)
        # Prefetch: the container starts while the first model call is out, unless no tool could use it.
        box = LazySandbox(lambda: open_sandbox(spec, s.sandbox), s.sandbox.command_timeout,
                          prefetch=s.sandbox.prefetch and bool(tools), remove_in_background=True)
        with box as sandbox:
            run = run_agent(ctx.client, row.row.prompt, tools, sandbox, max_turns=s.max_turns,
                            system_prompt=compose_system_prompt(s.ephemeral_system_prompt), prefill=ctx.prefill)
        error = run.error
    except SandboxError as e:
        error = str(e)
    except Exception as e:  # one prompt's failure must never stop the run
        log.exception("prompt %d failed", row.index)
        error = f"{type(e).__name__}: {e}"
    messages = run.messages if run else [{"role": "user", "content": row.row.prompt}]
    tool_stats, tool_error_counts = entry_tool_stats(messages, ALL_TOOL_NAMES)
    if error:
        status = "failed"
    elif not s.keep_unreasoned and not has_any_reasoning(messages):
        status = "discarded"
    else:
        status = "completed" if run.completed else "partial"
    entry = {
        "prompt_index": row.index,
        "conversations": to_sharegpt(messages, tools),
        "metadata": {**row.row.extra, "batch_num": batch_num,
                     "timestamp": datetime.now().isoformat(timespec="seconds"), "model": s.model},
        "completed": bool(run and run.completed and not error),
        "partial": bool(run and run.partial),
        "api_calls": run.api_calls if run else 0,
        "toolsets_used": toolsets,
        "tool_stats": tool_stats,
        "tool_error_counts": tool_error_counts,
        "hermes": {
            "key": row.key,
            "status": status,
            "error": error,
            "usage": run.usage if run else {},
            "elapsed": round(time.monotonic() - started, 3),
            # seconds the first tool call waited for the sandbox to be ready (None: no tool call)
            "sandbox_wait": None if box is None or box.wait is None else round(box.wait, 4),
            "hallucinated_tools": hallucinated_tools(messages, ALL_TOOL_NAMES),
            "reasoning": reasoning_counts(messages),
        },
    }
    if error:
        log.warning("prompt %d failed: %s", row.index, error)
    else:
        log.debug("prompt %d %s", row.index, status)
    return entry


def run_batch(batch_num: int, rows: list[Row], ctx: RunContext) -> dict[str, int]:
    """Run a batch's prompts concurrently; each finished prompt is appended to batch_N.jsonl at once."""
    path = ctx.run_dir / f"batch_{batch_num}.jsonl"
    counts = {"completed": 0, "partial": 0, "failed": 0, "discarded": 0}

    policy = RetryPolicy.for_settings(ctx.settings)

    def one(row: Row, attempt: int) -> float | None:
        limiter = ctx.limiter
        if limiter:
            limiter.acquire()
        try:
            entry = run_prompt(row, batch_num, ctx)
        finally:
            if limiter:
                limiter.release()
        # A transient failure goes back in the queue (hermes.requeue); each attempt is a journal line.
        retry_in = policy.delay(entry, attempt)
        entry["hermes"].update(attempt=attempt, requeued=retry_in is not None)
        journal.append(path, entry)
        if retry_in is not None:
            log.info("prompt %d: attempt %d failed (%s), again in %.1fs", row.index, attempt,
                     entry["hermes"]["error"], retry_in)
            return retry_in
        counts[entry["hermes"]["status"]] += 1
        if ctx.on_prompt_done:
            ctx.on_prompt_done(entry)
        return None

    RequeueingPool(min(len(rows), ctx.settings.num_workers), f"batch{batch_num}").run(rows, one)
    return counts
