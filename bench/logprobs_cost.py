"""Issue 44, item 4: what --logprobs costs per assistant turn, on disk and in memory.

    python -m bench.logprobs_cost [--prompts 40] [--out bench/logprobs_cost.json]

Disk: the same prompts (a tool-call turn, then an answer of about ANSWER_WORDS words) run against
the bundled mock server with and without --logprobs (`--engine direct`, local sandbox); the batch
files' bytes per assistant turn, and per token kept. The mock answers vLLM's way when asked
(`return_tokens_as_token_ids`: tokens named "token_id:N"), as a run sends it.
Memory: what one turn's kept tokens and logprobs hold in the interpreter while its prompt runs
(tracemalloc around hermes.model.logprobs.of_choice on a 256-token answer, OpenAI's shape), and
the peak of the whole run process beside the run without.
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSWER_WORDS = 120


def prompt(i: int) -> str:
    rng = random.Random(i)
    words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "token", "value", "print", "file"])
                     for _ in range(ANSWER_WORDS))
    turns = [{"reasoning": "look", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo hi"}}]},
             {"reasoning": "seen", "content": words}]
    return f"row {i} MOCK_SCRIPT: " + json.dumps({"turns": turns})


def run(work: Path, base_url: str, name: str, prompts: int, flags: list[str]) -> dict:
    dataset = work / "d.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": prompt(i)}) + "\n" for i in range(prompts)))
    cmd = [sys.executable, "-c", "import resource, runpy, sys; sys.argv = sys.argv[1:]; "
           "exec('try:\\n runpy.run_path(sys.argv[0], run_name=\"__main__\")\\nfinally:\\n "
           "print(\"MAXRSS\", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)')",
           str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=10", f"--run_name={name}",
           f"--output_dir={work / 'data'}", f"--base_url={base_url}", "--model=mock-model", "--engine=direct",
           "--distribution=terminal_only", "--sandbox_backend=local", "--sandbox_prefetch=false", *flags]
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=900)
    rss = next((int(ln.split()[1]) for ln in done.stderr.splitlines() if ln.startswith("MAXRSS")), None)
    lines = [json.loads(ln) for f in sorted((work / "data" / name).glob("batch_*.jsonl")) for ln in f.read_text().splitlines()]
    turns = sum(e["hermes"]["reasoning"]["total_assistant_turns"] for e in lines)
    tokens = sum(len(t["tokens"]) for e in lines for t in e["hermes"].get("logprobs") or [])
    size = sum(f.stat().st_size for f in (work / "data" / name).glob("batch_*.jsonl"))
    return {"run": name, "exit": done.returncode, "entries": len(lines), "assistant_turns": turns, "tokens_kept": tokens,
            "batch_bytes": size, "bytes_per_turn": round(size / max(turns, 1)), "peak_rss_kib": rss}


def memory_per_turn(tokens: int = 256) -> dict:
    from hermes.model.logprobs import of_choice

    rng = random.Random(0)
    choice = {"logprobs": {"content": [{"token": f"token_id:{rng.randrange(150000)}", "logprob": -rng.random() * 5,
                                        "bytes": [1, 2, 3], "top_logprobs": []} for _ in range(tokens)]}}
    raw = json.dumps(choice)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    parsed = json.loads(raw)
    kept = of_choice(parsed)
    del parsed  # the answer's dict goes once the reply is read; the kept lists (and their strings) stay
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"tokens": tokens, "kept_bytes": after - before, "kept_bytes_per_token":
            round((after - before) / tokens, 1), "kept": len(kept["tokens"])}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=40)
    p.add_argument("--out", default=str(ROOT / "bench" / "logprobs_cost.json"))
    a = p.parse_args()
    from mockllm.server import MockLLM

    out = {}
    with tempfile.TemporaryDirectory() as tmp, MockLLM() as server:
        out["without"] = run(Path(tmp), server.base_url, "plain", a.prompts, [])
        out["with"] = run(Path(tmp), server.base_url, "logprobs", a.prompts, ["--logprobs"])
    w, wo = out["with"], out["without"]
    out["disk_bytes_per_turn_added"] = w["bytes_per_turn"] - wo["bytes_per_turn"]
    out["disk_bytes_per_token"] = round((w["batch_bytes"] - wo["batch_bytes"]) / max(w["tokens_kept"], 1), 1)
    out["tokens_per_turn"] = round(w["tokens_kept"] / max(w["assistant_turns"], 1), 1)
    out["memory"] = memory_per_turn()
    print(json.dumps(out, indent=2))
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
