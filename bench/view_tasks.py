"""`hermes-batch view` on 10,000 tasks x 8 attempts (80,000 entries): the tasks page and a compare
view of 8 attempts, side by side with the entries page.

    python -m bench.view_tasks [--tasks 10000] [--attempts 8] [--repeats 5] [--scratch DIR] [--keep]

The run folder is written straight in the journal's shape (tests/view/journal.py: a model cannot
be made to vary a task's attempts turn by turn, and 80,000 real prompts would take hours here):
each attempt 4 to 12 terminal calls and a closing answer, attempts of a task sharing a prefix of
calls and diverging after it, a row check that passes for some attempts (tasks never solved,
always solved and flaky), one attempt in 40 a failed line, the system turn padded to the size of a
real run's tool list. Then the real command serves it on loopback; each figure is the median of
--repeats: the JSON API, and Chromium from goto() until the page marks itself shown.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.view_first_page import start_viewer, timed

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PAD = 12_000  # characters: a real run's system turn with its tool schemas is about this


def make_run(run: Path, tasks: int, attempts: int, seed: int = 7) -> tuple[int, list[str]]:
    sys.path.insert(0, str(ROOT))
    from tests.view import journal

    journal.SYSTEM = "You are a function calling AI model. <tools>\n" + "x" * SYSTEM_PAD + "\n</tools>"
    rng = random.Random(seed)
    run.mkdir(parents=True)
    keys, batch, out, size, pi = [], 0, [], 0, 0
    for t in range(tasks):
        key = f"{t:032x}-0"
        keys.append(key)
        shared = [journal.call("terminal", {"command": f"cat file_{t}_{i}.py"}, f"line {i}\n" * rng.randint(1, 40))
                  for i in range(rng.randint(2, 6))]
        rate = rng.choice([0.0, 1.0, 0.5, 0.25, 0.75])  # never, always, flaky
        for a in range(1, attempts + 1):
            steps = shared + [journal.call("terminal", {"command": f"sed -i s/{a}/{i}/ f.py"}, "ok")
                              for i in range(rng.randint(2, 6))] + [journal.say("Done.")]
            failed = rng.random() < 1 / 40
            passed = None if failed else rng.random() < rate
            out.append(json.dumps(journal.line(
                pi, key, f"Task {t}: fix the bug in file_{t}.py so the tests pass.", steps, trial=a,
                passed=passed, status="failed" if failed else "completed",
                error="model endpoint answered 429: slow down" if failed else None,
                output=("PASS" if passed else "FAIL: test_x\n" * 20), elapsed=rng.uniform(5, 120))) + "\n")
            if len(out) == 1000:
                path = run / f"batch_{batch}.jsonl"
                path.write_text("".join(out), encoding="utf-8")
                size, batch, out = size + path.stat().st_size, batch + 1, []
        pi += 1
    if out:
        path = run / f"batch_{batch}.jsonl"
        path.write_text("".join(out), encoding="utf-8")
        size += path.stat().st_size
    (run / "run.json").write_text(json.dumps({"run_name": run.name, "total_prompts": tasks * attempts,
                                              "model": "mock-model", "distribution": "default",
                                              "settings": {"attempts": attempts, "attempt_policy": "all"}}))
    return size, keys


def browser_times(url: str, paths: list[str], repeats: int) -> list[float]:
    import os

    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                              args=["--no-sandbox"] if os.geteuid() == 0 else [])
        for path in paths:
            times = []
            for _ in range(repeats):
                page = b.new_page()
                t0 = time.perf_counter()
                page.goto(url + path)
                page.wait_for_selector(f'body[data-shown="{page.url}"]', state="attached", timeout=120_000)
                times.append(time.perf_counter() - t0)
                assert page.query_selector("[data-testid=load-error]") is None, path
                page.close()
            out.append(statistics.median(times))
        b.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.view_tasks", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--attempts", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--scratch", default=None)
    p.add_argument("--keep", action="store_true")
    a = p.parse_args(argv)
    scratch = Path(a.scratch or tempfile.mkdtemp(prefix="bench-view-tasks-"))
    run = scratch / "data" / "tasks"
    rows: list[tuple[str, float]] = []
    try:
        t0 = time.perf_counter()
        size, keys = make_run(run, a.tasks, a.attempts)
        n = a.tasks * a.attempts
        print(f"run folder: {a.tasks} tasks x {a.attempts} attempts = {n} entries, {size / 2**20:.0f} MiB, "
              f"made in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        proc, url, cold = start_viewer(run)
        try:
            rows.append(("start, no viewer index (view.duckdb built)", cold))
            mid = keys[len(keys) // 2]
            rows.append(("tasks page, its first request (the per-task table built)", timed(url + "/api/tasks", 1)[0]))
            apis = [("entries page, first page (/api/entries)", "/api/entries"),
                    ("tasks page, first page (/api/tasks)", "/api/tasks"),
                    ("tasks page, flaky tasks (/api/tasks?kind=flaky)", "/api/tasks?kind=flaky"),
                    ("tasks page, sorted by pass rate", "/api/tasks?sort=pass_rate"),
                    ("tasks page, last page", f"/api/tasks?page={(a.tasks + 49) // 50}"),
                    ("next flaky task (/api/tasks/next)", f"/api/tasks/next?task={mid}&kind=flaky"),
                    (f"compare {a.attempts} attempts (/api/compare?task=)", f"/api/compare?task={mid}")]
            for name, path in apis:
                took, body = timed(url + path, a.repeats)
                if path == "/api/tasks":
                    assert body["tasks_total"] == a.tasks and len(body["tasks"]) == 50, body.get("tasks_total")
                if path.startswith("/api/compare"):
                    assert len(body["columns"]) == a.attempts
                rows.append((name, took))
            # a run still going: each request after new lines rebuilds the per-task table first
            times = []
            last = max(run.glob("batch_*.jsonl"), key=lambda q: int(q.stem.split("_")[1]))
            sample = last.read_text(encoding="utf-8").splitlines()[-1]
            for i in range(a.repeats):
                with open(last, "a", encoding="utf-8") as f:
                    f.write(sample.replace('"key": "', f'"key": "new{i}-', 1) + "\n")
                times.append(timed(url + "/api/tasks", 1)[0])
            rows.append(("tasks page, first page right after new journal lines (task table rebuilt)",
                         statistics.median(times)))
            shown = browser_times(url, ["/", "/tasks", f"/compare?task={mid}"], a.repeats)
            rows += [("entries page in Chromium (goto to shown)", shown[0]),
                     ("tasks page in Chromium (goto to shown)", shown[1]),
                     (f"compare of {a.attempts} attempts in Chromium (goto to shown)", shown[2])]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        if not a.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"| `hermes-batch view`, {a.tasks:,} tasks x {a.attempts} attempts (median of {a.repeats}) | seconds |\n|---|---|")
    for name, took in rows:
        print(f"| {name} | {took:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
