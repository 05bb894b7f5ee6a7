"""Journal lines in the run's own shape (hermes.data.trajectory's turns, the hermes block of
hermes.data.entry), written straight into a run folder: attempts that differ turn by turn, which a
scripted model cannot make (it answers a prompt the same way each time), and runs of any size for
bench/. Lines stopped by the attempt policy take issue 46's shape: status "stopped",
stop_reason "attempt_policy", no reward.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SYSTEM = "You are a function calling AI model. <tools>\n[]\n</tools>"


def call(name: str, arguments: dict, result: Any = "ok") -> tuple:
    return ("call", name, arguments, result)


def say(text: str) -> tuple:
    return ("text", text)


def conversation(prompt: str, steps: list[tuple]) -> list[dict]:
    turns = [{"from": "system", "value": SYSTEM}, {"from": "human", "value": prompt}]
    for n, step in enumerate(steps):
        if step[0] == "text":
            turns.append({"from": "gpt", "value": f"<think>\nStep {n + 1}.\n</think>\n{step[1]}"})
            continue
        _, name, arguments, result = step
        turns.append({"from": "gpt", "value": f"<think>\nNow {name}.\n</think>\n<tool_call>\n"
                      + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"})
        turns.append({"from": "tool", "value": "<tool_response>\n" + json.dumps(
            {"tool_call_id": f"call_{n}", "name": name, "content": result}) + "\n</tool_response>"})
    return turns


def line(prompt_index: int, key: str, prompt: str, steps: list[tuple], trial: int = 1, passed: bool | None = None,
         task: str | None = None, status: str = "completed", output: str = "", elapsed: float = 1.0,
         error: str | None = None, stop_reason: str | None = None, model: str = "mock-model") -> dict:
    tools: dict[str, dict] = {}
    for s in steps:
        if s[0] == "call":
            tools.setdefault(s[1], {"count": 0, "success": 0, "failure": 0})
            tools[s[1]]["count"] += 1
            tools[s[1]]["success"] += 1
    entry: dict[str, Any] = {
        "prompt_index": prompt_index, "conversations": conversation(prompt, steps),
        "metadata": {"batch_num": 0, "model": model}, "completed": status == "completed", "partial": False,
        "api_calls": len(steps), "toolsets_used": ["terminal"] if tools else [], "tool_stats": tools,
    }
    if passed is not None:
        entry["reward"] = {"passed": passed, "exit_code": 0 if passed else 1, "output": output, "truncated": False,
                           "timed_out": False, "duration": 0.1}
    hermes: dict[str, Any] = {"status": status, "key": key if trial == 1 else f"{key}#a{trial}", "elapsed": elapsed}
    if trial != 1:
        hermes["trial"] = trial
    if task:
        hermes["task"] = task
    if error:
        hermes["error"] = error
    if stop_reason:
        hermes["stop_reason"] = stop_reason
    entry["hermes"] = hermes
    return entry


def write_run(run: Path, lines: list[dict], settings: dict | None = None, per_batch: int = 1000,
              append: bool = False) -> Path:
    """The lines as batch files of `per_batch` and a run.json (appended to batch 0 with `append`)."""
    run.mkdir(parents=True, exist_ok=True)
    if append:
        with open(run / "batch_0.jsonl", "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(e) + "\n" for e in lines))
        return run
    for start in range(0, len(lines), per_batch):
        (run / f"batch_{start // per_batch}.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in lines[start:start + per_batch]), encoding="utf-8")
    (run / "run.json").write_text(json.dumps({"run_name": run.name, "total_prompts": len(lines), "model": "mock-model",
                                              "distribution": "default", "settings": settings or {}}))
    return run
