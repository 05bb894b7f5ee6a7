"""How long a prompt waits for its sandbox: prefetch on vs off, at several --num_workers.

A benchmark, not a test. Each configuration is one real run (`python batch_runner.py`,
real containers) against the bundled model server answering every call after a set
latency. The wait is what each run records itself: `hermes.sandbox_wait` in every line of
its batch files, the seconds from the prompt's first tool call to its sandbox being ready.

    python bench/sandbox_wait.py                     # 48 prompts, 1 s per model call, workers 8 and 32
    python bench/sandbox_wait.py --prompts 24 --latency 0.5 --workers 8 --repeat 2
    python bench/sandbox_wait.py --report bench/SANDBOX_REPORT.md
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the value at or below which q% of the values fall."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 100)) - 1))]


def one_run(out: Path, dataset: Path, base_url: str, workers: int, prefetch: bool, tag: str) -> dict:
    name = f"wait-{'on' if prefetch else 'off'}-w{workers}-{tag}"
    cmd = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=8",
           f"--run_name={name}", f"--output_dir={out}", f"--base_url={base_url}", "--model=mock-model",
           f"--num_workers={workers}", f"--sandbox_prefetch={str(prefetch).lower()}"]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    entries = [json.loads(line) for p in (out / name).glob("batch_*.jsonl") for line in p.read_text().splitlines() if line]
    waits = [e["hermes"]["sandbox_wait"] for e in entries if e["hermes"].get("sandbox_wait") is not None]
    elapsed = [e["hermes"]["elapsed"] for e in entries]
    return {"prefetch": prefetch, "workers": workers, "prompts": len(entries), "waited": len(waits),
            "median": statistics.median(waits), "p95": percentile(waits, 95), "max": max(waits),
            "prompt_median": statistics.median(elapsed), "wall": wall}


def write_dataset(path: Path, prompts: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"Benchmark prompt {i}: note a token and report the hostname."}) + "\n"
                            for i in range(prompts)))
    return path


def table(rows: list[dict]) -> str:
    head = ("| prefetch | num_workers | prompts | wait median (s) | wait p95 (s) | wait max (s) "
            "| prompt median (s) | run wall (s) |\n|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {'on' if r['prefetch'] else 'off'} | {r['workers']} | {r['prompts']} | {r['median']:.3f} | {r['p95']:.3f} "
        f"| {r['max']:.3f} | {r['prompt_median']:.2f} | {r['wall']:.1f} |\n" for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--latency", type=float, default=1.0, help="seconds the model server takes per call")
    ap.add_argument("--workers", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--repeat", type=int, default=1, help="runs per configuration, interleaved")
    ap.add_argument("--report", type=Path, default=None, help="write the results as markdown here")
    args = ap.parse_args()

    from mockllm import MockLLM
    from hermes.sandbox.image import ensure_default_image

    ensure_default_image()
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hermes-bench-") as tmp, MockLLM(latency=args.latency) as llm:
        dataset = write_dataset(Path(tmp) / "prompts.jsonl", args.prompts)
        for rep in range(args.repeat):
            for workers in args.workers:
                for prefetch in (False, True):
                    row = one_run(Path(tmp) / "data", dataset, llm.base_url, workers, prefetch, str(rep))
                    rows.append(row)
                    print(f"prefetch={'on ' if prefetch else 'off'} workers={workers:>3}: wait median "
                          f"{row['median']:.3f}s p95 {row['p95']:.3f}s max {row['max']:.3f}s "
                          f"(prompt median {row['prompt_median']:.2f}s, run {row['wall']:.1f}s)", flush=True)
    load_after = os.getloadavg()
    print()
    print(table(rows))
    if args.report:
        command = "python " + " ".join(shlex.quote(a) for a in [str(Path(sys.argv[0])), *sys.argv[1:]])
        args.report.write_text(report(rows, args, command, load_before, load_after))
        print(f"report: {args.report}")
    return 0


def report(rows: list[dict], args: argparse.Namespace, command: str, before: tuple, after: tuple) -> str:
    return f"""# Sandbox wait: prefetch on vs off

How long a prompt waits for its sandbox: from its first tool call asking for the sandbox to
the sandbox being ready (`hermes.sandbox_wait`, recorded by every run in its batch files).
Each row is one real run of {args.prompts} prompts (`python batch_runner.py`, one Docker
container per prompt) against the bundled model server answering every call after
{args.latency:g} s; each prompt makes 3 model calls and its first tool call comes after the
first answer.

Command:

    {command}

{table(rows)}
Machine: {os.cpu_count()} cores, shared with other developers' test runs (load average
{before[0]:.2f} before, {after[0]:.2f} after); timings are noisy, compare rows of one run.
"""


if __name__ == "__main__":
    sys.exit(main())
