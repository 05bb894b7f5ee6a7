"""One prompt, start to finish: sandbox, agent loop, trajectory entry, journal line.

Also one batch: its prompts run concurrently, as coroutines on the run's model-call loop,
bounded by the run's slots so that --num_workers counts prompts in flight across all batches.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from hermes.data import distributions, failures, journal
from hermes.agent.loop import compose_system_prompt
from hermes.agent.conversation import Conversation, converse_async, tool_context
from hermes.data.dataset import Row
from hermes.data.entry import HermesBlock, JournalEntry, Status
from hermes.data.failures import of_exception
from hermes.data.run_paths import RunPaths
from hermes.model import logprobs, sampling
from hermes.model.breaker import endpoint_wide
from hermes.model.client import ModelClient
from hermes.agent.offload import Offload
from hermes.agent.prefill import load_prefill
from hermes.run.admission import Admission
from hermes.run.prompt_log import log as prompt_log
from hermes.run.requeue import RetryPolicy, requeueing
from hermes.sandbox import SandboxBackend, SandboxError, SandboxSpec, get_backend
from hermes.sandbox.lifecycle import raise_if_stopping
from hermes.settings import RunSettings
from hermes.data.task import RowTask
from hermes.run import task_rows
from hermes.run.workerfiles import InFlight
from hermes.run.stops import Stops
from hermes.run.tool_use import tool_use
from hermes.data.stats import entry_tool_stats, hallucinated_tools, has_any_reasoning, reasoning_counts
from hermes.tools import (SharedResources, ToolContext, all_tool_names, availability, env_secret, needs_sandbox,
                          openai_schemas, tools_for)
from hermes.data.trajectory import to_sharegpt

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
    #: counts prompts in flight where a worker's file must say so (hermes.run.remote)
    in_flight: InFlight | None = None
    on_prompt_done: Callable[[dict[str, Any]], None] | None = None
    #: what tools share across the run's prompts (HTTP clients, a browser); closed with the run
    shared: SharedResources = field(default_factory=SharedResources)
    secret: Callable[[str], str | None] = env_secret
    #: the process running the prompts, host:pid, recorded in each entry's hermes block
    worker: str | None = None
    #: prompts handed to batches but not yet in a slot: when the next batch may start (hermes.run.admission)
    admission: Admission | None = None
    #: attempts the attempt policy stops in flight (hermes.run.stops)
    stops: Stops = field(default_factory=Stops)
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

    def stop_attempts(self, keys: list[str]) -> None:
        self.stops.stop(keys)

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


async def run_prompt(row: Row, batch_num: int, ctx: RunContext) -> JournalEntry:
    """Run one prompt to an entry: the reference's trajectory fields plus a `hermes` block.
    A coroutine on the run's model-call loop (run_batch)."""
    s = ctx.settings
    started = time.monotonic()
    toolsets = distributions.sample(ctx.distribution, s.seed, row.key)
    offered = tools_for(toolsets)
    image = row.row.container_image or s.sandbox.image
    spec = SandboxSpec(image=image, cwd=row.row.cwd, lifetime=s.prompt_timeout,  # it ends by itself past it
                       labels={"hermes-batch.run": ctx.run_id, "hermes-batch.prompt": str(row.index)})
    task = RowTask.of(row.row, s.setup_timeout, s.check_timeout)  # the row's setup and check, if any
    preview = row.row.prompt[: s.log_prefix_chars].replace("\n", " ")
    prompt_log.info("prompt %d started: %s", row.index, preview)
    error = None
    failure: BaseException | None = None  # what the error was, where it says (hermes.errors)
    done = None
    wait = None
    try:
        raise_if_stopping(ctx.run_id)  # an interrupted run starts no more prompts
        if task_rows.needs_preparing(row):  # its image built, a task folder's limits and verifier
            spec, task = await task_rows.prepare(row, spec, task, s, ctx.backend, ctx.offload())
        # Prefetch: the container starts while the first model call is out, unless no tool could use it
        # (web, vision... run here, not in the sandbox: a prompt offered only those makes no container).
        with sampling.for_prompt(row.key):  # its model calls' seeds (--sampling_seed)
            done = await converse_async(
                ctx.client, row.row.prompt, offered, spec, ctx.backend, offload=ctx.offload(),
                context=ctx.tool_context(row.key), max_turns=s.max_turns,
                system_prompt=compose_system_prompt(s.ephemeral_system_prompt), prefill=ctx.prefill,
                prefetch=s.sandbox.prefetch, remove_in_background=True, image_first=True,
                prepare=task and task.prepare, judge=task and task.judge, timeout=spec.lifetime)
        wait = done.sandbox_wait
        error, failure = done.run.error, done.run.failure
    except SandboxError as e:
        wait = getattr(e, "sandbox_wait", None)
        error, failure = str(e), e
    except Exception as e:  # one prompt's failure must never stop the run
        wait = getattr(e, "sandbox_wait", None)
        log.exception("prompt %d failed", row.index)
        error, failure = f"{type(e).__name__}: {e}", e
    entry = _entry(row, batch_num, ctx, toolsets, openai_schemas(offered), done, error, wait,
                   time.monotonic() - started)
    said = of_exception(failure) if error else None
    if said:  # the failure's kind beside its text: reports and the requeue read it (hermes.data.failures)
        entry.hermes.error_kind, entry.hermes.error_transient = said.kind, said.transient
    if error:
        prompt_log.warning("prompt %d failed: %s", row.index, error)
    else:
        prompt_log.info("prompt %d %s in %.1f s, %d model call(s)", row.index, entry.hermes.status,
                        entry.hermes.elapsed, entry.api_calls)
    return entry


def stopped_entry(row: Row, batch_num: int, ctx: RunContext) -> JournalEntry:
    """The line of an attempt the policy stopped: final, no verdict, never a trajectory."""
    entry = _entry(row, batch_num, ctx, [], [], None, None, None, 0.0)
    entry.hermes.status, entry.hermes.stop_reason = Status.STOPPED, "attempt_policy"
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
            trial=row.trial,
            task=row.row.task_folder.name if row.row.task_folder else None,
            **tool_use(messages, tools, ran=run is not None and not error),
            stop_reason=run.stop_reason if run else None,
            logprobs=logprobs.per_turn(messages) if s.logprobs and run else None,
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


async def _run_batch(batch_num: int, rows: list[Row], ctx: RunContext) -> dict[str, Any]:
    """The batch's outcome: a count per status, and under "failures" its failed prompts' errors
    by kind ({kind: {"count", "example"}}, the commonest first)."""
    path = RunPaths(ctx.run_dir).batch(batch_num)
    counts: dict[str, Any] = {str(s): 0 for s in (Status.COMPLETED, Status.PARTIAL, Status.FAILED, Status.DISCARDED,
                                                   Status.STOPPED)}
    errors: list[str | None] = []
    policy = RetryPolicy.for_settings(ctx.settings)
    slots, offload = ctx.slots(), ctx.offload()
    breaker = ctx.client.breaker
    held: dict[int, list[dict[str, Any]]] = {}  # requeued attempts' lines not yet written, by row
    started = 0

    async def one(row: Row, attempt: int) -> float | None:
        nonlocal started
        async with slots:  # --num_workers prompts in flight across the run's batches
            if attempt == 1:
                started += 1
                if ctx.admission:
                    ctx.admission.started()
            if breaker.open:  # the endpoint is down: the prompt stays owed, no line (hermes.model.breaker)
                held.pop(id(row), None)
                return None
            if ctx.in_flight:
                ctx.in_flight.started()
            try:
                stopped, entry = await ctx.stops.run(row.key, run_prompt(row, batch_num, ctx))
                if stopped:  # the attempt policy stopped it: a sibling passed (hermes.run.stops)
                    entry = stopped_entry(row, batch_num, ctx)
            finally:
                if ctx.in_flight:
                    ctx.in_flight.finished()
        wide = entry.hermes.status == Status.FAILED and endpoint_wide(entry.hermes.error_kind)
        if breaker.open and wide:
            held.pop(id(row), None)
            log.info("prompt %d: the model endpoint is down; not recorded, it stays owed", row.index)
            return None
        # A transient failure goes back in the queue (hermes.run.requeue); each attempt is a journal line.
        retry_in = policy.delay(entry.hermes, attempt)
        entry.hermes.attempt = attempt
        entry.hermes.requeued = retry_in is not None
        record = entry.record()
        if retry_in is not None and wide:
            # Held until its retry ends: if the breaker stops the run meanwhile, this attempt is not
            # written either, and the prompt stays owed, not failed (lost in a crash: owed all the same).
            held.setdefault(id(row), []).append(record)
        else:
            for earlier in held.pop(id(row), []):
                await offload(journal.append, path, earlier)
            await offload(journal.append, path, record)
        if retry_in is not None:
            log.info("prompt %d: attempt %d failed (%s), again in %.1fs", row.index, attempt,
                     entry.hermes.error, retry_in)
            return retry_in
        counts[str(entry.hermes.status)] += 1
        if entry.hermes.status == Status.FAILED:
            errors.append(entry.hermes.error)
        if ctx.on_prompt_done:
            ctx.on_prompt_done(record)
        return None

    try:
        await requeueing(rows, one)
    finally:
        if ctx.admission:
            ctx.admission.withdrawn(len(rows) - started)  # those the batch's end left unstarted
    counts["failures"] = failures.group(errors)
    if breaker.open:  # said to the flow, which may be another process (Dask, worker processes)
        counts["endpoint_down"] = breaker.reason
    return counts
