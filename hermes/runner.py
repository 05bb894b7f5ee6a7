"""One prompt, start to finish: sandbox, agent loop, trajectory entry, journal line.

Also one batch: its prompts run concurrently, as coroutines on the run's model-call loop,
bounded by the run's slots so that --num_workers counts prompts in flight across all batches.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from hermes import distributions, journal
from hermes.agent import compose_system_prompt
from hermes.conversation import Conversation, converse_async, tool_context
from hermes.dataset import Row
from hermes.entry import HermesBlock, JournalEntry, Status
from hermes.model import ModelClient
from hermes.offload import Offload
from hermes.requeue import RetryPolicy, requeueing
from hermes.sandbox import SandboxBackend, SandboxError, SandboxSpec, get_backend
from hermes.sandbox.lifecycle import raise_if_stopping
from hermes.settings import RunSettings
from hermes.task import RowTask
from hermes.workerfiles import InFlight
from hermes.stats import entry_tool_stats, hallucinated_tools, has_any_reasoning, reasoning_counts
from hermes.tools import (SharedResources, ToolContext, all_tool_names, availability, env_secret, needs_sandbox,
                          openai_schemas, tools_for)
from hermes.trajectory import to_sharegpt

log = logging.getLogger(__name__)


@dataclass
class RunContext:
    """What every prompt of one run shares. Built once per process."""

    settings: RunSettings
    run_id: str
    run_dir: Path
    client: ModelClient
    distribution: dict[str, int]
    backend: SandboxBackend  # settings.sandbox's backend, from the registry
    prefill: list[dict[str, Any]] = field(default_factory=list)
    #: counts prompts in flight where a worker's file must say so (hermes.remote)
    in_flight: InFlight | None = None
    on_prompt_done: Callable[[dict[str, Any]], None] | None = None
    #: what tools share across the run's prompts (HTTP clients, a browser); closed with the run
    shared: SharedResources = field(default_factory=SharedResources)
    secret: Callable[[str], str | None] = env_secret
    #: the process running the prompts, host:pid, recorded in each entry's hermes block
    worker: str | None = None
    _slots: asyncio.Semaphore | None = field(default=None, repr=False)
    _offload: Offload | None = field(default=None, repr=False)

    @classmethod
    def create(cls, settings: RunSettings, run_id: str, *, api_key: str | None = None,
               secret: Callable[[str], str | None] = env_secret, **kw) -> "RunContext":
        prefill = load_prefill(settings.prefill_messages_file)
        dist = distributions.usable(settings.distribution, availability(settings.tools, secret))
        run_dir = Path(settings.output_dir) / settings.run_name
        client = ModelClient(settings, api_key)
        return cls(settings=settings, run_id=run_id, run_dir=run_dir, client=client, distribution=dist,
                   backend=get_backend(settings.sandbox), prefill=prefill, secret=secret, **kw)

    @property
    def uses_sandbox(self) -> bool:
        """Can any prompt of this run be given a tool that runs in the sandbox?"""
        return needs_sandbox(tools_for(self.distribution))

    def tool_context(self, key: str) -> ToolContext:
        """One prompt's view of the run for its tool calls (the conversation adds the sandbox)."""
        return tool_context(self.settings, api_key=self.client.api_key, shared=self.shared,
                            secret=self.secret, run_dir=self.run_dir, key=key)

    def slots(self) -> asyncio.Semaphore:
        """--num_workers: how many of this process's prompts may be in flight at once, across
        all the run's batches (made on the loop's thread, the only one that uses it)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.settings.num_workers)
        return self._slots

    def offload(self) -> Offload:
        """The threads the prompts' blocking work runs on (tool calls, sandboxes, journal lines)."""
        if self._offload is None:
            self._offload = Offload(self.settings.num_workers)
        return self._offload

    def close(self) -> None:
        self.shared.close()
        self.client.close()
        if self._offload is not None:
            self._offload.close()


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


async def run_prompt(row: Row, batch_num: int, ctx: RunContext) -> JournalEntry:
    """Run one prompt to an entry: the reference's trajectory fields plus a `hermes` block.
    A coroutine on the run's model-call loop (run_batch)."""
    s = ctx.settings
    started = time.monotonic()
    toolsets = distributions.sample(ctx.distribution, s.seed, row.key)
    offered = tools_for(toolsets)
    image = row.row.container_image or s.sandbox.image
    spec = SandboxSpec(image=image, cwd=row.row.cwd,
                       labels={"hermes-batch.run": ctx.run_id, "hermes-batch.prompt": str(row.index)})
    task = RowTask.of(row.row, s.setup_timeout, s.check_timeout)  # the row's setup and check, if any
    preview = row.row.prompt[: s.log_prefix_chars].replace("\n", " ")
    log.debug("prompt %d started: %s", row.index, preview)
    error = None
    done = None
    wait = None
    try:
        raise_if_stopping(ctx.run_id)  # an interrupted run starts no more prompts
        # Prefetch: the container starts while the first model call is out, unless no tool could use it
        # (web, vision... run here, not in the sandbox: a prompt offered only those makes no container).
        done = await converse_async(
            ctx.client, row.row.prompt, offered, spec, ctx.backend, offload=ctx.offload(),
            context=ctx.tool_context(row.key), max_turns=s.max_turns,
            system_prompt=compose_system_prompt(s.ephemeral_system_prompt), prefill=ctx.prefill,
            prefetch=s.sandbox.prefetch, remove_in_background=True, image_first=True,
            prepare=task and task.prepare, judge=task and task.judge, timeout=s.prompt_timeout)
        wait = done.sandbox_wait
        error = done.run.error
    except SandboxError as e:
        wait = getattr(e, "sandbox_wait", None)
        error = str(e)
    except Exception as e:  # one prompt's failure must never stop the run
        wait = getattr(e, "sandbox_wait", None)
        log.exception("prompt %d failed", row.index)
        error = f"{type(e).__name__}: {e}"
    entry = _entry(row, batch_num, ctx, toolsets, openai_schemas(offered), done, error, wait,
                   time.monotonic() - started)
    if error:
        log.warning("prompt %d failed: %s", row.index, error)
    else:
        log.debug("prompt %d %s", row.index, entry.hermes.status)
    return entry


def _entry(row: Row, batch_num: int, ctx: RunContext, toolsets: list[str], tools: list[dict[str, Any]],
           done: Conversation | None, error: str | None, wait: float | None, elapsed: float) -> JournalEntry:
    s = ctx.settings
    run = done.run if done else None
    messages = run.messages if run else [{"role": "user", "content": row.row.prompt}]
    all_tools = all_tool_names()
    tool_stats, tool_error_counts = entry_tool_stats(messages, all_tools)
    if error:
        status = Status.FAILED
    elif not s.keep_unreasoned and not has_any_reasoning(messages):
        status = Status.DISCARDED
    else:
        status = Status.COMPLETED if run.completed else Status.PARTIAL
    return JournalEntry(
        prompt_index=row.index,
        conversations=to_sharegpt(messages, tools),
        metadata={**row.row.extra, "batch_num": batch_num,
                  "timestamp": datetime.now().isoformat(timespec="seconds"), "model": s.model},
        completed=bool(run and run.completed and not error),
        partial=bool(run and run.partial),
        api_calls=run.api_calls if run else 0,
        toolsets_used=toolsets,
        tool_stats=tool_stats,
        tool_error_counts=tool_error_counts,
        reward=done.reward if done and not error else None,
        hermes=HermesBlock(
            key=row.key,
            status=status,
            error=error,
            usage=run.usage if run else {},
            elapsed=round(elapsed, 3),
            sandbox_wait=None if wait is None else round(wait, 4),
            hallucinated_tools=hallucinated_tools(messages, all_tools),
            reasoning=reasoning_counts(messages),
            aux_usage=done.tools.aux_usage if done else {},
            files=done.tools.files if done else [],
            worker=ctx.worker,
        ),
    )


def run_batch(batch_num: int, rows: list[Row], ctx: RunContext) -> dict[str, int]:
    """Run a batch's prompts concurrently; each finished prompt is appended to batch_N.jsonl at once.

    The prompts are coroutines on the loop the run's model calls go out from (ctx.client), not a
    thread each: with hundreds in flight, every answer handed from the loop to a waiting thread
    cost the interpreter lock's hand-over, and that, not the work, bounded the run
    (bench/THROUGHPUT.md, workload 4). What blocks runs on ctx.offload()'s threads.
    """
    return ctx.client.run_on_loop(_run_batch(batch_num, rows, ctx))


def start_batch(batch_num: int, rows: list[Row], ctx: RunContext) -> "concurrent.futures.Future[dict[str, int]]":
    """run_batch without a thread waiting for it: its future (the direct engine's fan-out)."""
    return ctx.client.start_on_loop(_run_batch(batch_num, rows, ctx))


async def _run_batch(batch_num: int, rows: list[Row], ctx: RunContext) -> dict[str, int]:
    path = ctx.run_dir / f"batch_{batch_num}.jsonl"
    counts = {str(s): 0 for s in (Status.COMPLETED, Status.PARTIAL, Status.FAILED, Status.DISCARDED)}
    policy = RetryPolicy.for_settings(ctx.settings)
    slots, offload = ctx.slots(), ctx.offload()

    async def one(row: Row, attempt: int) -> float | None:
        async with slots:  # --num_workers prompts in flight across the run's batches
            if ctx.in_flight:
                ctx.in_flight.started()
            try:
                entry = await run_prompt(row, batch_num, ctx)
            finally:
                if ctx.in_flight:
                    ctx.in_flight.finished()
        # A transient failure goes back in the queue (hermes.requeue); each attempt is a journal line.
        retry_in = policy.delay(entry.hermes, attempt)
        entry.hermes.attempt = attempt
        entry.hermes.requeued = retry_in is not None
        record = entry.record()
        await offload(journal.append, path, record)
        if retry_in is not None:
            log.info("prompt %d: attempt %d failed (%s), again in %.1fs", row.index, attempt,
                     entry.hermes.error, retry_in)
            return retry_in
        counts[str(entry.hermes.status)] += 1
        if ctx.on_prompt_done:
            ctx.on_prompt_done(record)
        return None

    await requeueing(rows, one)
    return counts
