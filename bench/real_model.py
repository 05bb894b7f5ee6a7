"""A real model in the loop (issue #44, item 7): Qwen2.5-Coder-1.5B-Instruct behind llama.cpp's server.

A benchmark, not a test: too slow for CI (CI replays recorded answers of this model instead:
bench/real_model_record.py). Runs bench/real_model_tasks.jsonl (eight small terminal tasks,
each with a row check) through the default path, `hermes-batch run` on the Prefect engine with
Docker sandboxes, once per --tool_call_parser value and server mode, and reports per run:
checks passed, tool calls per prompt by how they arrived (statistics.json's tool_use block),
prompts that acted, the loud no-tool-use warning, tokens/s and prompts/s.

    python -m bench.real_model_fetch                    # the model, into /work/models
    python -m bench.real_model --parsers auto native --modes template

`--keep_unreasoned` is passed: this model writes no reasoning, and the quality filter would
otherwise discard every sample (which is not what is measured here). Timings on the shared
2-core machine are noisy: compare runs of one invocation, not across days.
"""
from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import real_model_serve  # noqa: E402

TASKS = REPO / "bench" / "real_model_tasks.jsonl"
RESULTS = REPO / "bench" / "real_model_results.json"
#: llama.cpp's per-request timings, as its server prints them
PERF = re.compile(r"^\s*(?:llama_perf_context_print:\s*)?(prompt eval|eval) time =\s*([\d.]+) ms /\s*(\d+)", re.M)


def log(msg: str) -> None:
    print(f"[real_model {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Recorder:
    """A loopback proxy between the run and the server that keeps every chat request and the answer as it
    came (bench/real_model_record.py --from turns them into the parser tests' cases): the runs
    themselves are the recording, no second pass of the model needed."""

    def __init__(self, upstream: str, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        me, self.count, self.lock = self, 0, threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def _relay(self, body: bytes | None) -> None:
                req = urllib.request.Request(upstream.rsplit("/v1", 1)[0] + self.path, data=body, method=self.command,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=3600) as r:
                        status, raw = r.status, r.read()
                except urllib.error.HTTPError as e:
                    status, raw = e.code, e.read()
                if body and self.path.endswith("/chat/completions"):
                    with me.lock:
                        me.count += 1
                        n = me.count
                    record = {"request": json.loads(body), "status": status, "response": json.loads(raw or b"null")}
                    (folder / f"{n:04d}.json").write_text(json.dumps(record, ensure_ascii=False) + "\n")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:  # noqa: N802 (http.server's names)
                self._relay(None)

            def do_POST(self) -> None:  # noqa: N802
                self._relay(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_command(a: argparse.Namespace, base_url: str, parser: str, run_name: str, out_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "flows.cli", "run", f"--dataset_file={a.tasks}", f"--batch_size={a.batch_size}",
           f"--run_name={run_name}", f"--base_url={base_url}", f"--model={a.alias}", "--api_key=none",
           "--distribution=terminal_only", f"--max_turns={a.max_turns}", f"--num_workers={a.num_workers}",
           f"--max_tokens={a.max_tokens}", "--keep_unreasoned", f"--output_dir={out_dir}", "--seed=1"]
    if a.max_samples:
        cmd.append(f"--max_samples={a.max_samples}")
    if parser != "default":
        cmd.append(f"--tool_call_parser={parser}")
    return cmd


def server_perf(text: str) -> dict[str, float]:
    """Sum of llama.cpp's own timings over the requests in `text` (a slice of the server's log)."""
    ms = {"prompt eval": 0.0, "eval": 0.0}
    tokens = {"prompt eval": 0, "eval": 0}
    for kind, t, n in PERF.findall(text):
        ms[kind] += float(t)
        tokens[kind] += int(n)
    return {"prompt_tokens": tokens["prompt eval"], "prompt_seconds": round(ms["prompt eval"] / 1000, 2),
            "generated_tokens": tokens["eval"], "generation_seconds": round(ms["eval"] / 1000, 2),
            "prompt_tokens_per_s": round(tokens["prompt eval"] / (ms["prompt eval"] / 1000), 2) if ms["prompt eval"] else None,
            "generation_tokens_per_s": round(tokens["eval"] / (ms["eval"] / 1000), 2) if ms["eval"] else None}


def journal(run_dir: Path) -> list[dict[str, Any]]:
    """The run's journal lines (batch_N.jsonl): the last line of each prompt key wins."""
    last: dict[str, dict[str, Any]] = {}
    for f in sorted(run_dir.glob("batch_*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                e = json.loads(line)
                last[e["hermes"]["key"]] = e
    return sorted(last.values(), key=lambda e: e["prompt_index"])


def calls_of(entry: dict[str, Any]) -> int:
    return sum(s.get("count", 0) for s in (entry.get("tool_stats") or {}).values())


def _by_format(per_prompt: list[dict[str, Any]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for p in per_prompt:
        for fmt, n in p["tool_calls_by_format"].items():
            total[fmt] = total.get(fmt, 0) + n
    return total


def summarise(run_dir: Path, tasks: list[dict[str, Any]], wall: float, stdout: str, perf: dict[str, Any]) -> dict[str, Any]:
    entries = journal(run_dir)
    stats = json.loads((run_dir / "statistics.json").read_text()) if (run_dir / "statistics.json").exists() else {}
    per_prompt = []
    for e in entries:
        h = e["hermes"]
        per_prompt.append({
            "task": tasks[e["prompt_index"]].get("task", str(e["prompt_index"])),
            "status": h["status"], "api_calls": e.get("api_calls"), "tool_calls": calls_of(e),
            "check_passed": (e.get("reward") or {}).get("passed"),
            # how this entry's calls arrived (native, or the text format they were recovered from)
            "tool_calls_by_format": h.get("tool_calls_by_format") or {},
            "no_tool_use": h.get("no_tool_use", False),
            "completion_tokens": (h.get("usage") or {}).get("completion_tokens", 0),
            "error": h.get("error"),
        })
    completion = sum(p["completion_tokens"] for p in per_prompt)
    prompt_tokens = sum((e["hermes"].get("usage") or {}).get("prompt_tokens", 0) for e in entries)
    tool_use = stats.get("tool_use") or {}
    return {
        "prompts": len(entries),
        "checks_passed": sum(1 for p in per_prompt if p["check_passed"]),
        "prompts_acted": sum(1 for p in per_prompt if p["tool_calls"] > 0),
        "tool_calls": sum(p["tool_calls"] for p in per_prompt),
        "tool_calls_per_prompt": round(sum(p["tool_calls"] for p in per_prompt) / max(len(entries), 1), 2),
        "tool_calls_by_format": _by_format(per_prompt),
        "prompts_no_tool_use": sum(1 for p in per_prompt if p["no_tool_use"]),
        "statistics_tool_use": {k: v for k, v in tool_use.items() if k != "warning"},
        "statuses": {s: sum(1 for p in per_prompt if p["status"] == s) for s in sorted({p["status"] for p in per_prompt})},
        # the loud warning (hermes.run.tool_use): in statistics.json, and on the summary's screen
        "no_tool_use_warning": tool_use.get("warning"),
        "warning_in_summary": "WARNING:" in stdout,
        "wall_seconds": round(wall, 1),
        "prompts_per_s": round(len(entries) / wall, 4),
        "completion_tokens": completion, "prompt_tokens": prompt_tokens,
        "completion_tokens_per_wall_s": round(completion / wall, 2),
        "server": perf,
        "per_prompt": per_prompt,
    }


def one_run(a: argparse.Namespace, base_url: str, mode: str, parser: str, scratch: Path, server_log: Path,
            tasks: list[dict[str, Any]]) -> dict[str, Any]:
    run_name = f"real-{mode}-{parser}-{int(time.time())}"
    cmd = run_command(a, base_url, parser, run_name, scratch / "data")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "OPENAI_", "OPENROUTER_"))}
    env["PYTHONPATH"] = str(REPO)
    log(f"{mode}/{parser}: {' '.join(cmd[2:])}")
    offset = server_log.stat().st_size
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=a.run_timeout)
    wall = time.perf_counter() - started
    with open(server_log, "rb") as f:
        f.seek(offset)
        perf = server_perf(f.read().decode(errors="replace"))
    (scratch / f"{run_name}.stdout").write_text(done.stdout + "\n--- stderr\n" + done.stderr)
    if done.returncode != 0 and not (scratch / "data" / run_name / "statistics.json").exists():
        raise RuntimeError(f"{mode}/{parser}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = summarise(scratch / "data" / run_name, tasks, wall, done.stdout + done.stderr, perf)
    result.update(mode=mode, parser=parser, exit_code=done.returncode, summary_tail=done.stdout.splitlines()[-25:])
    log(f"{mode}/{parser}: checks {result['checks_passed']}/{result['prompts']}, calls {result['tool_calls']}, "
        f"acted {result['prompts_acted']}, {result['wall_seconds']} s")
    return result


def render(result: dict[str, Any]) -> str:
    """The results as the markdown table of bench/REPORT.md's "Real model (issue #44)" section."""
    rows = ["| tasks | server mode | --tool_call_parser | checks passed | prompts that acted | tool calls (by how they arrived) "
            "| calls / prompt | no-tool-use warning | statuses | wall s | prompts/s | completion tok/s (wall) "
            "| server gen tok/s |", "|" + "---|" * 13]
    for r in result["runs"]:
        by = ", ".join(f"{n} {k}" for k, n in sorted(r["tool_calls_by_format"].items())) or "none"
        rows.append(f"| {Path(r.get('tasks') or result.get('tasks', '')).name} | {r['mode']} | {r['parser']} | {r['checks_passed']}/{r['prompts']} | {r['prompts_acted']}/{r['prompts']} "
                    f"| {r['tool_calls']} ({by}) | {r['tool_calls_per_prompt']} | {'yes' if r['no_tool_use_warning'] else 'no'} "
                    f"| {', '.join(f'{n} {k}' for k, n in r['statuses'].items())} | {r['wall_seconds']} | {r['prompts_per_s']} "
                    f"| {r['completion_tokens_per_wall_s']} | {r['server'].get('generation_tokens_per_s') or 'n/a'} |")
    totals = ["", "| --tool_call_parser | tasks | checks passed | prompts that acted | tool calls (by how they arrived) |",
              "|---|---|---|---|---|"]
    for parser, t in (result.get("by_parser") or {}).items():
        by = ", ".join(f"{n} {k}" for k, n in sorted(t["tool_calls_by_format"].items())) or "none"
        totals.append(f"| {parser} | {t['prompts']} | {t['checks_passed']}/{t['prompts']} | {t['prompts_acted']}/{t['prompts']} "
                      f"| {t['tool_calls']} ({by}) |")
    parsers = sorted({r["parser"] for r in result["runs"]})
    cells: dict[str, dict[str, str]] = {}
    for r in result["runs"]:
        for pp in r["per_prompt"]:
            calls = ", ".join(f"{n} {k}" for k, n in sorted(pp["tool_calls_by_format"].items())) or "0"
            cells.setdefault(pp["task"], {})[r["parser"]] = f"{'pass' if pp['check_passed'] else 'fail'}; {calls}"
    per_task = ["", "| task | " + " | ".join(f"{p}: check; calls" for p in parsers) + " |", "|---|" + "---|" * len(parsers)]
    per_task += [f"| {task} | " + " | ".join(c.get(p, "") for p in parsers) + " |" for task, c in cells.items()]
    if len(totals) == 3:
        totals = []
    return "\n".join(rows + totals + per_task)


def combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Several invocations' results (the task set run in halves, say) as one: their runs, and totals per parser."""
    result = {k: v for k, v in parts[0].items() if k not in ("runs", "command", "tasks")}
    result["commands"] = [p["command"] for p in parts]
    result["runs"] = [dict(r, tasks=p["tasks"]) for p in parts for r in p["runs"]]
    by_parser: dict[str, dict[str, Any]] = {}
    for r in result["runs"]:
        t = by_parser.setdefault(r["parser"], {"prompts": 0, "checks_passed": 0, "prompts_acted": 0, "tool_calls": 0,
                                               "tool_calls_by_format": {}, "completion_tokens": 0, "wall_seconds": 0.0})
        for k in ("prompts", "checks_passed", "prompts_acted", "tool_calls", "completion_tokens", "wall_seconds"):
            t[k] += r[k]
        for fmt, n in r["tool_calls_by_format"].items():
            t["tool_calls_by_format"][fmt] = t["tool_calls_by_format"].get(fmt, 0) + n
    result["by_parser"] = by_parser
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.real_model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parsers", nargs="+", default=["auto", "native"],
                   help="--tool_call_parser values to compare ('default': pass none)")
    p.add_argument("--modes", nargs="+", choices=sorted(real_model_serve.MODES), default=["template"])
    p.add_argument("--tasks", type=Path, default=TASKS)
    p.add_argument("--model", type=Path, default=real_model_serve.DEFAULT_MODEL)
    p.add_argument("--python", type=Path, default=real_model_serve.DEFAULT_PYTHON)
    p.add_argument("--alias", default="qwen2.5-coder-1.5b")
    p.add_argument("--max_turns", type=int, default=6)
    p.add_argument("--max_samples", type=int, default=None, help="only the first N tasks")
    p.add_argument("--max_tokens", type=int, default=512)
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--run_timeout", type=float, default=3600)
    p.add_argument("--base_url", help="a server already running (bench.real_model_serve) instead of starting "
                   "one per mode; --modes then names its one mode")
    p.add_argument("--server_log", type=Path, help="that server's output, for llama.cpp's own timings")
    p.add_argument("--record", type=Path, help="keep every request and raw answer of the runs in this folder "
                   "(for bench.real_model_record --from)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--keep", action="store_true", help="keep the scratch folder (runs, stdout, server log)")
    p.add_argument("--render", type=Path, help="print this results file as markdown and exit")
    p.add_argument("--combine", type=Path, nargs="+", help="write these results files as one (--out) and exit")
    a = p.parse_args(argv)
    if a.combine:
        a.out.write_text(json.dumps(combine([json.loads(f.read_text()) for f in a.combine]), indent=1) + "\n")
        log(f"wrote {a.out}")
        return 0
    if a.render:
        print(render(json.loads(a.render.read_text())))
        return 0
    tasks = [json.loads(line) for line in a.tasks.read_text().splitlines() if line.strip()]
    scratch = Path(tempfile.mkdtemp(prefix="hermes-real-model-"))
    runs = []
    try:
        for mode in a.modes:
            server_log = a.server_log or scratch / f"llama-{mode}.log"
            if a.base_url:
                server_log.touch()
                server = contextlib.nullcontext(a.base_url)
            else:
                server = real_model_serve.serve(mode, model=a.model, python=a.python, threads=a.threads,
                                                alias=a.alias, log=server_log)
            with server as base_url:
                for parser in a.parsers:
                    recorder = Recorder(base_url, a.record / f"{mode}-{parser}") if a.record else None
                    try:
                        runs.append(one_run(a, recorder.base_url if recorder else base_url, mode, parser, scratch,
                                            server_log, tasks))
                    finally:
                        if recorder:
                            recorder.close()
    finally:
        if a.keep:
            log(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    result = {
        "model": a.model.name, "server": "llama-cpp-python[server]==0.3.36, CPU, "
                                           f"{a.threads} threads, n_ctx 8192",
        "tasks": str(a.tasks.relative_to(REPO)) if a.tasks.is_relative_to(REPO) else str(a.tasks),
        "command": "python -m bench.real_model " + " ".join(argv if argv is not None else sys.argv[1:]),
        "flags": {"distribution": "terminal_only", "max_turns": a.max_turns, "max_tokens": a.max_tokens,
                  "num_workers": a.num_workers, "max_samples": a.max_samples, "batch_size": a.batch_size, "keep_unreasoned": True},
        "machine": f"{os.cpu_count()} cores (shared with other work: timings are noisy)",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs,
    }
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
