"""`--attempts 4` on the demo tasks against four separate runs of `--attempts 1`, side by side.

    python -m bench.attempts_bench --repeats 2 --output bench/tasks_results.json

Starts the bundled scripted model (`hermes-batch mock-llm --port P`) and, in each repeat, times
one run of

    python batch_runner.py --dataset_file deployments/demo/tasks --attempts 4 --batch_size 2
        --run_name X --base_url http://127.0.0.1:P/v1 --model mock --distribution terminal_only
        --engine direct --output_dir SCRATCH

against four sequential runs of the same with `--attempts 1` and their own run names. The two
alternate (the single run first in even repeats, the four first in odd ones). Beside each: wall
time, the 1-minute load average, entries written, checks passed, and whether statistics.json
holds pass@k (task_statistics.pass_at_k). The output folder is a temporary one, removed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATASET = REPO / "deployments" / "demo" / "tasks"


def log(msg: str) -> None:
    print(f"[attempts_bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def start_mock(port: int, logfile: Path) -> tuple[subprocess.Popen, str]:
    """The bundled model server, its output in a file (never a pipe left unread); its URL."""
    with open(logfile, "w") as f:
        p = subprocess.Popen(["hermes-batch", "mock-llm", "--port", str(port)], stdout=f, stderr=subprocess.STDOUT)
    for _ in range(100):
        m = re.search(r"(http://\S+/v1)", logfile.read_text())
        if m:
            return p, m.group(1)
        time.sleep(0.1)
    p.terminate()
    raise RuntimeError(f"mock-llm did not start: {logfile.read_text()!r}")


def one_run(out: Path, url: str, name: str, attempts: int, batch_size: int) -> dict[str, Any]:
    cmd = ["python", "batch_runner.py", "--dataset_file", str(DATASET), "--attempts", str(attempts),
           "--batch_size", str(batch_size), "--run_name", name, "--base_url", url, "--model", "mock",
           "--distribution", "terminal_only", "--engine", "direct", "--output_dir", str(out)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - t0
    res: dict[str, Any] = {"run_name": name, "attempts": attempts, "wall_s": round(wall, 2), "rc": p.returncode}
    try:
        st = json.loads((out / name / "statistics.json").read_text())
        ts = st.get("task_statistics") or {}
        res.update(entries=st.get("trajectories_written"), failed=st.get("prompts_failed"),
                   checks=(st.get("check_statistics") or {}), pass_at_k=ts.get("pass_at_k"),
                   task_attempts={k: v.get("attempts") for k, v in (ts.get("tasks") or {}).items()})
    except (OSError, ValueError) as e:
        res["error"] = f"{e}; {(p.stdout + p.stderr)[-1500:]}"
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--attempts", type=int, default=4)
    ap.add_argument("--batch_size", type=int, default=2)
    ap.add_argument("--port", type=int, default=0, help="the mock model's port (0: any free one)")
    ap.add_argument("--output", type=Path, help="write the raw results here (JSON, key 'attempts')")
    a = ap.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="attempts-bench-"))
    mock, url = start_mock(a.port, scratch / "mock-llm.log")
    log(f"mock model at {url}; output under {scratch}; load {os.getloadavg()}")
    rows: list[dict[str, Any]] = []
    try:
        for rep in range(a.repeats):
            order = ["single", "separate"] if rep % 2 == 0 else ["separate", "single"]
            for kind in order:
                load0 = os.getloadavg()[0]
                t0 = time.monotonic()
                if kind == "single":
                    runs = [one_run(scratch, url, f"att{a.attempts}-r{rep}", a.attempts, a.batch_size)]
                else:
                    runs = [one_run(scratch, url, f"sep-r{rep}-{i}", 1, a.batch_size) for i in range(a.attempts)]
                wall = time.monotonic() - t0
                row = {"repeat": rep, "kind": kind, "wall_s": round(wall, 2), "load1_before": load0,
                       "load1_after": os.getloadavg()[0], "entries": sum(r.get("entries") or 0 for r in runs),
                       "runs": runs}
                rows.append(row)
                log(f"{kind:8s} {wall:6.2f} s  entries {row['entries']}  pass@k {runs[0].get('pass_at_k')}  "
                    f"load {load0:.2f}")
    finally:
        mock.terminate()
        mock.wait(timeout=10)
        shutil.rmtree(scratch, ignore_errors=True)
    single = [r["wall_s"] for r in rows if r["kind"] == "single"]
    separate = [r["wall_s"] for r in rows if r["kind"] == "separate"]
    summary = {"single_s": single, "separate_s": separate,
               "ratios_by_repeat": [round(s / p, 3) for s, p in zip(single, separate)]}
    log(json.dumps(summary))
    if a.output:
        data = json.loads(a.output.read_text()) if a.output.exists() else {}
        data["attempts"] = {"rows": rows, "summary": summary, "nproc": os.cpu_count(), "load1_at_end": os.getloadavg()}
        a.output.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
