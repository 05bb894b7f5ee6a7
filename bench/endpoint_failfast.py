"""Issue 44, item 6: a run against a closed port (a wrong --base_url), 20 prompts, as a user runs it.

    python -m bench.endpoint_failfast [--prompts 20] [--skip-before] [--out bench/endpoint_failfast.json]

Three ways, each `batch_runner.py --engine direct` in a subprocess, timed start to exit:
  before   --check_endpoint=false --breaker_seconds=1e9: what a run did before this change (every
           prompt burns the client's retries and the run's requeues, then ends failed)
  breaker  --check_endpoint=false: the check skipped, the circuit breaker (default 60 s) stops it
  after    the default: the endpoint check refuses the run before the fan-out
For each: seconds, exit code, the prompts the journal marks failed (a resume must redo them all
the same; "failed" is what the user is told), and whether the run folder was created at all.
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"before": ["--check_endpoint=false", "--breaker_seconds=1000000000"],
            "breaker": ["--check_endpoint=false"],
            "after": []}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(work: Path, name: str, flags: list[str], prompts: int) -> dict:
    dataset = work / "d.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"prompt {i}"}) + "\n" for i in range(prompts)))
    cmd = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=5",
           f"--run_name={name}", f"--output_dir={work / 'data'}", f"--base_url=http://127.0.0.1:{closed_port()}/v1",
           "--model=any", "--engine=direct", "--distribution=terminal_only", "--sandbox_backend=local", *flags]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - started
    run_dir = work / "data" / name
    failed = 0
    for f in sorted(run_dir.glob("batch_*.jsonl")):
        last: dict[str, str] = {}
        for line in f.read_text().splitlines():
            h = json.loads(line)["hermes"]
            last[h["key"]] = h["status"]
        failed += sum(1 for s in last.values() if s == "failed")
    said = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    return {"variant": name, "seconds": round(seconds, 1), "exit": done.returncode, "journal_failed": failed,
            "run_folder": run_dir.exists(), "said": said[-1][:300] if said else ""}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--skip-before", action="store_true", help="the 7-minute 'before' run left out")
    p.add_argument("--out", default=str(ROOT / "bench" / "endpoint_failfast.json"))
    a = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in VARIANTS.items():
            if name == "before" and a.skip_before:
                continue
            results.append(one(Path(tmp), name, flags, a.prompts))
            print(json.dumps(results[-1]), flush=True)
    Path(a.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
