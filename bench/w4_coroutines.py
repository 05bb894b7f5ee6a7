"""What workload 4 could reach if each prompt were a coroutine (issue 21's open design step).

    python -m bench.w4_coroutines --url http://127.0.0.1:PORT/v1 --prompts 2048 --in-flight 512 --pool 32

NOT the product: no Prefect, no resume, no statistics, no retries of prompts. Each prompt is a
coroutine on one uvloop loop, its model calls through hermes.model.calls.Endpoint (as the
product's), its tool calls, its local sandbox's making and closing and its journal line on a
pool of `--pool` threads, with the product's own functions (run_tool, LazySandbox,
journal.append, to_sharegpt). Run it against the bundled model server at 1 s
(`python -m bench.mockserver --port 0 --latency 1 --turns 3`), side by side with the product's
`--engine direct`; results in bench/THROUGHPUT.md, session 6. Journal lines go to a temporary
folder, removed at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from hermes.data import journal
from hermes.agent.loop import compose_system_prompt
from hermes.model.client import _for_api, _reply_of_dict
from hermes.model.calls import Endpoint, new_event_loop
from hermes.model.ratelimit import AdaptiveLimiter
from hermes.sandbox import SandboxSpec, get_backend
from hermes.sandbox.base import SandboxSettings
from hermes.sandbox.lazy import LazySandbox
from hermes.tools import ToolContext, openai_schemas, run_tool, tools_for
from hermes.data.trajectory import to_sharegpt

OFFERED = tools_for(["terminal", "file"])
TOOLS = openai_schemas(OFFERED)
SYSTEM = compose_system_prompt(None)
BACKEND = get_backend(SandboxSettings(backend="local"))


async def prompt(i: int, endpoint: Endpoint, pool: concurrent.futures.Executor, slots: asyncio.Semaphore,
                 out: Path) -> None:
    loop = asyncio.get_running_loop()
    async with slots:
        box = LazySandbox(lambda: BACKEND.open(SandboxSpec(image="unused")), 60, remove_in_background=True)
        ctx = ToolContext()
        ctx.sandbox, ctx.offered = box, frozenset(t.name for t in OFFERED)
        messages = [{"role": "user", "content": f"Task {i}: inspect the machine, take notes and report."}]
        for _ in range(10):
            body = {"model": "mock-model", "tools": TOOLS,
                    "messages": [_for_api(m) for m in [{"role": "system", "content": SYSTEM}, *messages]]}
            reply = _reply_of_dict(await endpoint.post(body))
            messages.append(reply.message)
            calls = reply.message.get("tool_calls") or []
            if not calls:
                break
            results = await loop.run_in_executor(pool, lambda: [
                run_tool(c["function"]["name"], c["function"]["arguments"], ctx, call_id=c["id"]) for c in calls])
            messages += [{"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": r}
                         for c, r in zip(calls, results)]

        def finish() -> None:
            box.close()
            journal.append(out / f"batch_{i // 4}.jsonl", {"prompt_index": i, "conversations": to_sharegpt(messages, TOOLS)})
        await loop.run_in_executor(pool, finish)


async def run(url: str, n: int, in_flight: int, pool_size: int, out: Path) -> None:
    endpoint = Endpoint(url, "bench", limiter=AdaptiveLimiter(in_flight), max_retries=2, timeout=600)
    with concurrent.futures.ThreadPoolExecutor(pool_size) as pool:
        slots = asyncio.Semaphore(in_flight)
        await asyncio.gather(*(prompt(i, endpoint, pool, slots, out) for i in range(n)))
    await endpoint.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--prompts", type=int, default=2048)
    p.add_argument("--in-flight", type=int, default=512)
    p.add_argument("--pool", type=int, default=32)
    a = p.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="hermes-w4-coroutines-"))
    started = time.time()
    try:
        new_event_loop().run_until_complete(run(a.url, a.prompts, a.in_flight, a.pool, out))
        BACKEND.drain(60)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    r = resource.getrusage(resource.RUSAGE_SELF)
    print(f"wall {time.time() - started:.1f}s user {r.ru_utime:.1f}s sys {r.ru_stime:.1f}s "
          f"voluntary context switches {r.ru_nvcsw}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
