"""The default CLI path's fixed cost: a reused local Prefect server against the alternatives.

A benchmark, not a test. Wall time of one `python batch_runner.py` invocation over a 20-prompt
dataset on the bundled mock model (one terminal call and an answer per prompt, local sandbox),
four ways, alternating, in each repeat's own fresh PREFECT_HOME (so "first" includes creating the
database, as a first run after set-up does):

- first:     the default path, no server yet (starts the background server)
- second:    the default path again (reuses it)
- ephemeral: HERMES_PREFECT_SERVER=ephemeral (Prefect's embedded server, booted for the run)
- direct:    --engine direct (no Prefect)

    python -m bench.default_path --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from flows import local_server  # noqa: E402
from mockllm import MockLLM  # noqa: E402

VARIANTS = ("first", "second", "ephemeral", "direct")


def write_dataset(path: Path, n: int) -> Path:
    turns = [{"tool_calls": [{"name": "terminal", "arguments": {"command": "echo hi"}}]}, {"content": "done"}]
    path.write_text("".join(json.dumps({"prompt": f"p{i} MOCK_SCRIPT: " + json.dumps({"turns": turns})}) + "\n"
                            for i in range(n)))
    return path


def one_run(variant: str, home: Path, work: Path, dataset: Path, base_url: str, tag: str) -> float:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_API_URL", "HERMES_", "OPENAI_", "OPENROUTER_"))}
    env.update(PREFECT_HOME=str(home), PYTHONPATH=str(REPO))
    cmd = [sys.executable, str(REPO / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=5",
           f"--run_name=dp-{tag}-{variant}", f"--base_url={base_url}", "--model=mock-model", "--api_key=bench",
           "--num_workers=4", "--distribution=terminal_only", "--sandbox_backend=local",
           "--sandbox_prefetch=false", "--output_dir", str(work / "data")]
    if variant == "ephemeral":
        env[local_server.MODE_ENV] = "ephemeral"
    if variant == "direct":
        cmd.append("--engine=direct")
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{variant}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    said_ui = "Prefect UI:" in done.stdout
    if said_ui != (variant in ("first", "second")):
        raise RuntimeError(f"{variant}: unexpected server use\n{done.stdout[-2000:]}")
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.default_path", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompts", type=int, default=20)
    a = p.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="hermes-bench-default-path-"))
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    loads: list[float] = []
    try:
        dataset = write_dataset(scratch / "prompts.jsonl", a.prompts)
        with MockLLM() as mock:
            for r in range(a.repeats):
                home = scratch / f"home-{r}"
                # alternate the order of the variants that do not depend on each other
                order = ["first", "second"] + (["ephemeral", "direct"] if r % 2 == 0 else ["direct", "ephemeral"])
                try:
                    for variant in order:
                        took = one_run(variant, home, scratch, dataset, mock.base_url, f"{r}")
                        times[variant].append(took)
                        load = os.getloadavg()[0]
                        loads.append(load)
                        print(f"repeat {r + 1}: {variant:<10} {took:6.2f} s  (load avg {load:.1f})", flush=True)
                finally:
                    local_server.stop(home)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nload average (1 min) during the runs: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores")
    print(f"\n| variant ({a.prompts} prompts, {a.repeats} repeats) | median s | min s | max s |\n|---|---|---|---|")
    for v in VARIANTS:
        t = times[v]
        print(f"| {v} | {statistics.median(t):.2f} | {min(t):.2f} | {max(t):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
