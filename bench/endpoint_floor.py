"""The model server's own limit: what a minimal client gets out of it at a given concurrency.

    python -m bench.endpoint_floor --url http://127.0.0.1:PORT/v1 --prompts 2048 --concurrency 512

The latency-bound workloads' "ideal" (prompts × calls × latency / concurrency) assumes an
endpoint that answers every request in exactly its latency however many are in flight. The
bundled model server is a Python process on the same two cores; at hundreds of requests in
flight it answers later than that. This measures by how much, as bench/sandbox_limit.py does
for containers: one asyncio loop, one aiohttp session, `concurrency` conversations at a time,
each the workload's (the system prompt and tool schemas of `terminal` and `file`, 3 calls, the
tool results sent back as a real run sends them), no agent, no tools run, no files written.
Prints one JSON object: prompts/s between the first and the last request sent, and the mean time
a call took against the server's set latency.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp

from hermes.agent import compose_system_prompt
from hermes.tools import openai_schemas, tools_for


async def conversation(session: aiohttp.ClientSession, url: str, i: int, tools: list, system: str,
                       calls: list[float], marks: list[float]) -> None:
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": f"Task {i}: inspect the machine, take notes and report."}]
    while True:
        marks.append(time.time())  # as the server's own first/last request times in bench/run.py
        t0 = time.monotonic()
        async with session.post(url, json={"model": "mock-model", "messages": messages, "tools": tools}) as r:
            answer = await r.json()
        calls.append(time.monotonic() - t0)
        message = answer["choices"][0]["message"]
        messages.append({k: v for k, v in message.items() if k != "reasoning"})
        if not message.get("tool_calls"):
            return
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": json.dumps({"output": "vm\n", "exit_code": 0, "error": None})})


async def main(url: str, prompts: int, concurrency: int) -> dict:
    offered = tools_for(["terminal", "file"])
    tools = openai_schemas(offered)
    system = compose_system_prompt(None)  # what the agent sends as its system message
    calls: list[float] = []
    marks: list[float] = []
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(i: int) -> None:
            async with gate:
                await conversation(session, url.rstrip("/") + "/chat/completions", i, tools, system, calls, marks)
        started = time.time()
        await asyncio.gather(*(one(i) for i in range(prompts)))
    steady = max(marks) - min(marks)
    return {"prompts": prompts, "concurrency": concurrency, "calls": len(calls), "wall": time.time() - started,
            "steady": steady, "steady_prompts_per_s": prompts / steady if steady > 0 else None,
            "mean_call_s": statistics.mean(calls), "p90_call_s": sorted(calls)[int(0.9 * len(calls))]}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--prompts", type=int, default=2048)
    p.add_argument("--concurrency", type=int, default=512)
    a = p.parse_args()
    print(json.dumps(asyncio.run(main(a.url, a.prompts, a.concurrency))))
