"""Record real answers of Qwen2.5-Coder-1.5B-Instruct (llama.cpp, the model's own template) for CI.

CI cannot run the model (minutes per answer on 2 cores); the text tool-call parser's tests replay
what it really wrote instead. Each case sends the request a batch run sends (the agent's system
prompt, the terminal and file tools' schemas, one user prompt) at temperature 0 with a fixed
seed, and writes the raw reply to tests/model/recorded/real_qwen25coder_<case>.json.

The file is a case of tests/model/test_textcalls.py (format: tests/model/recorded/README.md).
Its `expected` calls are a person's reading of the reply, not the parser's output (a test
checking the parser against its own output could not fail): a new or changed reply is written
with `"expected": null`, and this script names the files to read and fill in by hand. A
re-recording whose reply is unchanged keeps the reviewed expectation and its `about`.

    python -m bench.real_model_record                      # starts the server itself
    python -m bench.real_model_record --base_url http://127.0.0.1:8090/v1 --cases prose_only
    python -m bench.real_model_record --from /work/models/recorded --out /tmp/cases   # the runs' answers
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import real_model_serve  # noqa: E402
from hermes.agent.loop import compose_system_prompt  # noqa: E402
from hermes.tools import openai_schemas, tools_for  # noqa: E402

OUT = REPO / "tests" / "model" / "recorded"
PREFIX = "real_qwen25coder_"
TOOLSETS = ["terminal", "file"]  # the terminal_only distribution
TASKS = REPO / "bench" / "real_model_tasks.jsonl"

#: case -> user prompt. The bench's tasks (where the model writes calls as text, in several
#: shapes), and answers that must not count as calls: prose, and JSON shown as an example.
EXTRA_CASES = {
    "prose_only": "In two sentences, what is the difference between a list and a tuple in Python?",
    "json_example": "Show me an example JSON object for a user with a name and an age. Just show it, do not "
                    "create any file.",
    "json_call_shape_example": "Explain, with one JSON example, how an OpenAI function call to a weather tool "
                               "named get_weather looks (its name and arguments). Do not call any tool.",
}


def cases() -> dict[str, str]:
    rows = [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()]
    return {**{f"task_{r['task']}": r["prompt"] for r in rows}, **EXTRA_CASES}


def request(prompt: str, model: str, max_tokens: int, seed: int) -> dict[str, Any]:
    return {"model": model, "temperature": 0, "seed": seed, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": compose_system_prompt(None)},
                         {"role": "user", "content": prompt}],
            "tools": openai_schemas(tools_for(TOOLSETS))}


def post(base_url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"{base_url}/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.load(r)


def fixture(case: str, body: dict[str, Any], response: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    """The parser tests' case format (tests/model/recorded/README.md), plus `recorded` (how)."""
    content = response["choices"][0]["message"].get("content")
    same = old is not None and old["response"]["choices"][0]["message"].get("content") == content
    return {
        "about": old["about"] if same else f"real: Qwen2.5-Coder-1.5B-Instruct Q4_K_M under llama.cpp's server with "
                                           f"the model's own template, asked {case!r} (TODO: what it shows)",
        "tools": [t["function"]["name"] for t in body["tools"]],
        "parser": "auto",
        "response": response,
        # a person's reading of the reply: {"content": prose left, "calls": [{"name", "arguments", "format"}]}
        "expected": old["expected"] if same else None,
        "recorded": {"by": "bench/real_model_record.py", "server": "llama-cpp-python[server]==0.3.36 (CPU), no "
                     "--chat_format", "model": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                     "at": old["recorded"]["at"] if same else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     **{k: body[k] for k in ("temperature", "seed", "max_tokens") if k in body},
                     "messages": body["messages"]},
    }


def from_runs(folder: Path, out: Path) -> list[Path]:
    """Cases from what bench.real_model --record kept: every answer of the runs, named by the task
    whose prompt it answered, the folder (server mode and parser) and the turn."""
    by_prompt = {r["prompt"]: r["task"] for r in (json.loads(line) for line in TASKS.read_text().splitlines() if line.strip())}
    written = []
    for rec_path in sorted(folder.rglob("*.json")):
        rec = json.loads(rec_path.read_text())
        if rec.get("status") != 200:
            continue
        body = rec["request"]
        user = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        case = f"task_{by_prompt.get(user, 'unknown')}_{rec_path.parent.name}_turn{turn}"
        path = out / f"{PREFIX}{case}.json"
        old = json.loads(path.read_text()) if path.exists() else None
        path.write_text(json.dumps(fixture(case, body, rec["response"], old), indent=1, ensure_ascii=False) + "\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.real_model_record", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base_url", help="a running server (else one is started in template mode)")
    p.add_argument("--cases", nargs="*", help="only these cases (default: all)")
    p.add_argument("--alias", default="qwen2.5-coder-1.5b")
    p.add_argument("--max_tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--from", dest="runs", type=Path, help="no requests: make cases of what bench.real_model "
                   "--record kept in this folder")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    if a.runs:
        a.out.mkdir(parents=True, exist_ok=True)
        for path in from_runs(a.runs, a.out):
            print(path)
        return 0
    wanted = cases()
    if a.cases:
        unknown = set(a.cases) - set(wanted)
        if unknown:
            raise SystemExit(f"unknown cases {sorted(unknown)}; known: {sorted(wanted)}")
        wanted = {k: wanted[k] for k in a.cases}
    a.out.mkdir(parents=True, exist_ok=True)
    todo = []
    server = (contextlib.nullcontext(a.base_url) if a.base_url
              else real_model_serve.serve("template", alias=a.alias))
    with server as base_url:
        for case, prompt in wanted.items():
            path = a.out / f"{PREFIX}{case}.json"
            old = json.loads(path.read_text()) if path.exists() else None
            body = request(prompt, a.alias, a.max_tokens, a.seed)
            started = time.perf_counter()
            response = post(base_url, body)
            fx = fixture(case, body, response, old)
            path.write_text(json.dumps(fx, indent=1, ensure_ascii=False) + "\n")
            reviewed = fx["expected"] is not None
            print(f"{case}: {time.perf_counter() - started:.0f} s, {'reviewed' if reviewed else 'TO REVIEW'}: "
                  f"{(response['choices'][0]['message'].get('content') or '')[:120]!r}", flush=True)
            if not reviewed:
                todo.append(path)
    if todo:
        print("read these replies, write `expected` and `about` by hand (tests/model/recorded/README.md):\n  " +
              "\n  ".join(str(t.relative_to(REPO)) if t.is_relative_to(REPO) else str(t) for t in todo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
