"""`hermes-batch view` on a 100,000-entry run: how soon it serves, and how fast its pages answer.

    python -m bench.view_first_page [--entries 100000] [--scratch DIR] [--keep]

The run folder is made from a real small run (the direct engine, local sandboxes, the bundled model
server): its journal lines are the templates, copied to --entries lines in batch files of 1,000
with their prompt_index, key, prompt and outcome varied (5% failed with one of three reasons,
a third with a row check, half of those passed). Then the real command serves it on loopback and
this script measures, with the median of --repeats:

  - the command's start with no viewer index (view.duckdb built from the journal) and again with
    it (nothing new to read);
  - /api/entries (the first page), filtered pages, the last page, /api/summary, one entry;
  - the first page in Chromium: from goto() until the page marks its rows shown.
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH = 1000
REASONS = ["model endpoint answered 429: slow down", "Docker engine too slow: no answer in 60 s",
           "setup command 1/1 failed (exit 3): make"]


def templates(tmp: Path) -> list[dict]:
    from hermes.run import direct
    from hermes.sandbox.base import SandboxSettings
    from hermes.settings import RunSettings
    from mockllm import MockLLM

    rows = [{"prompt": f"Template prompt {i}: write a file, run it, report.", "check": "true"} for i in range(6)]
    (tmp / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with MockLLM() as server:
        direct.run(RunSettings(dataset_file=str(tmp / "rows.jsonl"), run_name="templates", output_dir=str(tmp),
                               base_url=server.base_url, model="mock-model", batch_size=6, num_workers=2,
                               sandbox=SandboxSettings(backend="local")))
    return [json.loads(line) for line in (tmp / "templates" / "batch_0.jsonl").read_text().splitlines()]


def make_run(run: Path, entries: int, lines: list[dict]) -> int:
    run.mkdir(parents=True)
    size = 0
    for start in range(0, entries, BATCH):
        out = []
        for i in range(start, min(start + BATCH, entries)):
            e = json.loads(json.dumps(lines[i % len(lines)]))
            e["prompt_index"] = i
            e["conversations"][1]["value"] = f"Prompt {i}: " + e["conversations"][1]["value"]
            e["metadata"]["batch_num"] = start // BATCH
            e["hermes"]["key"] = f"{i:032x}-0"
            if i % 20 == 7:
                e["hermes"]["status"], e["hermes"]["error"], e["completed"] = "failed", REASONS[i % 3], False
            if i % 3:
                e.pop("reward", None)
            elif "reward" in e:
                e["reward"]["passed"] = bool(i % 2)
            # keep the journal's key order: `reward` (when there is one) just before `hermes`
            hermes = e.pop("hermes")
            e["hermes"] = hermes
            out.append(json.dumps(e, ensure_ascii=False) + "\n")
        path = run / f"batch_{start // BATCH}.jsonl"
        path.write_text("".join(out), encoding="utf-8")
        size += path.stat().st_size
    (run / "run.json").write_text(json.dumps({"run_name": run.name, "total_prompts": entries, "model": "mock-model",
                                              "distribution": "default"}))
    return size


def start_viewer(run: Path) -> tuple[subprocess.Popen, str, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "view", run.name, "--output_dir", str(run.parent),
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    took = time.perf_counter() - t0
    if "http://" not in line:
        proc.kill()
        raise SystemExit(f"the viewer did not start: {line!r}")
    return proc, line.split(" at ")[1].split()[0].rstrip("/"), took


def timed(url: str, repeats: int) -> tuple[float, dict]:
    times, body = [], {}
    for _ in range(repeats):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as r:
            body = json.loads(r.read())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), body


def browser_first_page(url: str, repeats: int) -> float:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                              args=["--no-sandbox"] if os.geteuid() == 0 else [])
        times = []
        for _ in range(repeats):
            page = b.new_page()
            t0 = time.perf_counter()
            page.goto(url + "/")
            page.wait_for_selector(f'body[data-shown="{url}/"]', state="attached", timeout=120_000)
            times.append(time.perf_counter() - t0)
            assert len(page.query_selector_all("[data-testid=entry-row]")) == 50
            page.close()
        b.close()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.view_first_page", description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--scratch", default=None)
    p.add_argument("--keep", action="store_true")
    a = p.parse_args(argv)
    scratch = Path(a.scratch or tempfile.mkdtemp(prefix="bench-view-"))
    scratch.mkdir(parents=True, exist_ok=True)
    run = scratch / "data" / "big"
    try:
        t0 = time.perf_counter()
        size = make_run(run, a.entries, templates(scratch))
        print(f"run folder: {a.entries} entries, {size / 2**20:.0f} MiB of journal, made in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)
        rows = []
        proc, url, cold = start_viewer(run)
        try:
            rows.append(("start, no viewer index (view.duckdb built)", cold))
            pages = [("first page (/api/entries)", "/api/entries"),
                     ("first page, status=failed", "/api/entries?status=failed"),
                     ("first page, text search q=prompt 99999", "/api/entries?q=prompt%2099999"),
                     ("first page, toolset=terminal & check passed", "/api/entries?toolset=terminal&reward=passed"),
                     ("last page", f"/api/entries?page={(a.entries + 49) // 50}"),
                     ("summary (/api/summary)", "/api/summary"),
                     ("one entry (/api/entry/N)", f"/api/entry/{a.entries // 2}")]
            for name, path in pages:
                took, body = timed(url + path, a.repeats)
                if path == "/api/entries":
                    assert body["total"] == a.entries and len(body["entries"]) == 50
                rows.append((name, took))
            rows.append(("first page in Chromium (goto to rows shown)", browser_first_page(url, a.repeats)))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        proc, url, warm = start_viewer(run)
        proc.terminate()
        proc.wait(timeout=30)
        rows.insert(1, ("start, viewer index up to date", warm))
    finally:
        if not a.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"| `hermes-batch view`, {a.entries:,} entries (median of {a.repeats}) | seconds |\n|---|---|")
    for name, took in rows:
        print(f"| {name} | {took:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
