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

With `--tools` the tool calls are done for real, as plainly as an asyncio client can (a folder per
prompt, files written and read there, each command an asyncio subprocess of `/bin/sh -c`): what a
minimal client gets out of this machine when the workload's commands run too.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

import aiohttp

from hermes.agent.loop import compose_system_prompt
from hermes.tools import openai_schemas, tools_for


async def conversation(session: aiohttp.ClientSession, url: str, i: int, tools: list, system: str,
                       calls: list[float], marks: list[float], work: Any = None) -> None:
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
            content = json.dumps({"output": "vm\n", "exit_code": 0, "error": None})
            if work is not None:
                content = await work(i, call["function"]["name"], json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})


def real_tools(where: str):
    """The workload's tool calls done for real, as plainly as a client can: a folder per prompt,
    files written and read, commands run with `/bin/sh -c` (an asyncio subprocess each)."""
    async def work(i: int, name: str, args: dict) -> str:
        root = os.path.join(where, str(i))
        os.makedirs(root, exist_ok=True)
        if name == "write_file":
            with open(os.path.join(root, os.path.basename(args["path"])), "w") as f:
                f.write(args["content"])
            return json.dumps({"bytes_written": len(args["content"]), "path": args["path"]})
        if name == "read_file":
            with open(os.path.join(root, os.path.basename(args["path"]))) as f:
                return json.dumps({"content": "     1|" + f.read(), "total_lines": 1})
        proc = await asyncio.create_subprocess_exec("/bin/sh", "-c", args["command"], cwd=root,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        return json.dumps({"output": out.decode(), "exit_code": proc.returncode, "error": None})
    return work


async def main(url: str, prompts: int, concurrency: int, tools_for_real: bool = False) -> dict:
    offered = tools_for(["terminal", "file"])
    tools = openai_schemas(offered)
    system = compose_system_prompt(None)  # what the agent sends as its system message
    calls: list[float] = []
    marks: list[float] = []
    gate = asyncio.Semaphore(concurrency)
    scratch = tempfile.mkdtemp(prefix="hermes-floor-") if tools_for_real else None
    work = real_tools(scratch) if scratch else None
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(i: int) -> None:
            async with gate:
                await conversation(session, url.rstrip("/") + "/chat/completions", i, tools, system, calls, marks,
                                   work)
        started = time.time()
        await asyncio.gather(*(one(i) for i in range(prompts)))
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    steady = max(marks) - min(marks)
    return {"prompts": prompts, "concurrency": concurrency, "calls": len(calls), "wall": time.time() - started,
            "steady": steady, "steady_prompts_per_s": prompts / steady if steady > 0 else None,
            "mean_call_s": statistics.mean(calls), "p90_call_s": sorted(calls)[int(0.9 * len(calls))]}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--prompts", type=int, default=2048)
    p.add_argument("--concurrency", type=int, default=512)
    p.add_argument("--tools", action="store_true",
                   help="do the tool calls for real (files in a folder per prompt, commands with /bin/sh)")
    a = p.parse_args()
    if a.tools and sys.version_info < (3, 12) and hasattr(os, "pidfd_open"):
        # 3.12's default; 3.11's waits for each child on a thread of its own (131-133 prompts/s
        # against 136-137 at workload 4, bench/THROUGHPUT.md session 11)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    print(json.dumps(asyncio.run(main(a.url, a.prompts, a.concurrency, a.tools))))
