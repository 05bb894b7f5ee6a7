"""Data scale in flight: a run's peak memory against its dataset's length (issue 34).

    python -m bench.inflight_memory --prompts 2000,20000,200000 --engines direct,prefect
    python -m bench.inflight_memory --prompts 2000 --engines direct --num_workers 16,64,256

Each run: `batch_runner.py` over N one-line prompts, `--sandbox_backend local`, `--distribution
terminal_only` (one write_file and one terminal call a prompt, a folder each), the bundled mock at
zero latency, `--num_workers 64` (or each of --num_workers's list), `--batch_size 10`; the peak RSS of
the run's process tree (the run and its children; the mock and, on the Prefect engine, the
background server are outside it, the server's own growth is reported beside) sampled every 0.5 s, the run's own process's peak
RSS as the kernel counts it (VmHWM, read every 50 ms), and prompts a second. Prints one
JSON line per run; --output appends them to a file.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


def tree_rss(proc: psutil.Process) -> int:
    """The tree's proportional set size: a child forked from the run (a command's fork before its
    exec, a watcher) shares the run's pages, and plain RSS would count them once per child."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_full_info().pss
        except psutil.Error:
            pass
    return total


def server_rss(home: Path) -> int | None:
    try:
        pid = json.loads((home / "hermes-server.json").read_text())["pid"]
        return tree_rss(psutil.Process(pid))
    except (OSError, ValueError, KeyError, psutil.Error):
        return None


def one(n: int, engine: str, scratch: Path, base_url: str, home: Path, workers: int = 64) -> dict:
    data = scratch / f"d{n}.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"prompt": f"prompt number {i} of the data-scale run"}) + "\n"
                                for i in range(n)))
    name = f"mem-{engine}-{n}-w{workers}-{int(time.time())}"
    env = {**os.environ, "PREFECT_HOME": str(home), "HERMES_API_KEY": "k"}
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, str(REPO / "batch_runner.py"), f"--dataset_file={data}", "--batch_size=10",
           f"--run_name={name}", f"--base_url={base_url}", "--model=m", f"--num_workers={workers}",
           "--distribution=terminal_only", "--sandbox_backend=local", f"--engine={engine}",
           f"--output_dir={scratch / 'data'}"]
    server_before = server_rss(home)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=scratch, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ps = psutil.Process(proc.pid)
    peak, hwm, polls, timeline = 0, 0, 0, []
    while proc.poll() is None:
        try:  # the run's own process's high-water mark, as the kernel keeps it (its descendants' are their own)
            with open(f"/proc/{proc.pid}/status") as f:
                hwm = max(hwm, next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")))
            if polls % 10 == 0:
                peak = max(peak, tree_rss(ps))
            if polls % 100 == 0:  # (seconds, run process's peak so far in MiB) every 5 s: when it grows
                timeline.append((round(time.monotonic() - started), round(hwm / 1024)))
        except (OSError, StopIteration, psutil.Error):
            pass
        polls += 1
        time.sleep(0.05)
    wall = time.monotonic() - started
    try:
        stats = json.loads((scratch / "data" / name / "statistics.json").read_text())
        done = (stats.get("prompts_completed"), stats.get("prompts_failed"))
    except (OSError, ValueError):
        done = (None, None)
    return {"completed": done[0], "failed": done[1], "hwm_timeline": timeline,"engine": engine, "prompts": n, "exit": proc.returncode, "wall_s": round(wall, 1),
            "prompts_per_s": round(n / wall, 1),
            "peak_rss_mib": round(hwm / 1024, 1), "peak_tree_pss_mib": round(peak / 2 ** 20, 1),
            "server_pss_mib_before": server_before and round(server_before / 2 ** 20, 1),
            "server_pss_mib_after": (s := server_rss(home)) and round(s / 2 ** 20, 1),
            "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", default="2000,20000")
    p.add_argument("--engines", default="direct,prefect")
    p.add_argument("--num_workers", default="64", help="prompts in flight; a comma list runs each")
    p.add_argument("--output", default=None)
    a = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from mockllm import MockLLM

    with tempfile.TemporaryDirectory(prefix="hermes-inflight-") as tmp, MockLLM() as llm:
        scratch = Path(tmp)
        home = scratch / "prefect-home"
        home.mkdir()
        try:
            for n in [int(x) for x in a.prompts.split(",")]:
                for engine, workers in [(e, int(w)) for e in a.engines.split(",") for w in a.num_workers.split(",")]:
                    res = one(n, engine, scratch, llm.base_url, home, workers)
                    res["num_workers"] = workers
                    print(json.dumps(res), flush=True)
                    if a.output:
                        with open(a.output, "a") as f:
                            f.write(json.dumps(res) + "\n")
        finally:
            subprocess.run([sys.executable, "-m", "flows.cli", "server", "stop"], cwd=REPO,
                           env={**os.environ, "PREFECT_HOME": str(home)}, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
