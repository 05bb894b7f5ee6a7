"""Workload 5, our side: synthetic journals, the merge, and resume planning.

    python -m bench.datascale gen-merge   DIR --n 100000 [--batch-size 100]
    python -m bench.datascale merge       DIR                  # times hermes.run.merge.merge
    python -m bench.datascale gen-resume  DIR --rows 1000000 --done 990000 [--batch-size 1000]
    python -m bench.datascale plan        DIR [--cold]         # times session-style planning

Every timed command prints one JSON object (seconds, bytes, ru_maxrss). The merge input is made
of entries in exactly the shape hermes/run/runner.py writes (trajectory fields plus the `hermes`
block), built with our own to_sharegpt/entry_tool_stats from a conversation like the scripted
model's (3 model calls, write_file + terminal, then read_file, then an answer): about 9 KB a
line, 97% completed, 2% failed, 1% discarded. The resume journal has compact lines (the
prompt, a one-line answer and the `hermes` block, ~0.5 KB): only keys and statuses matter there.
"""
from __future__ import annotations

import os as _os
import sys as _sys

if _os.environ.get("HERMES_BENCH_SRC"):  # measure the benchmark's snapshot of the product, not the live tree
    _sys.path.insert(0, _os.environ["HERMES_BENCH_SRC"])

import argparse
import json
import resource
import shutil
import sys
import time
from pathlib import Path

from hermes.data.dataset import PromptRow, content_hash


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _prompt(i: int) -> str:
    return f"Task {i}: inspect the machine, write notes/{i % 997}.txt and summarise what you find."


def _key(i: int) -> str:
    return f"{content_hash(PromptRow(prompt=_prompt(i)))}-0"


# --------------------------------------------------------------------------- merge input


def _template_entry(status: str) -> str:
    """One journal line with placeholders @@IDX@@, @@KEY@@, @@TOK@@, @@PROMPT@@ (JSON-safe)."""
    from hermes.tools import all_tool_names
    ALL_TOOL_NAMES = all_tool_names()
    from hermes.data.stats import entry_tool_stats, hallucinated_tools, reasoning_counts
    from hermes.tools import openai_schemas, tools_for
    from hermes.data.trajectory import to_sharegpt

    tools = openai_schemas(tools_for(["terminal", "file"]))
    tok = "@@TOK@@"
    prompt = "@@PROMPT@@"
    msgs = [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": None,
         "reasoning": f"The task is: '{prompt}'. I will start with write_file, terminal, in parallel where I can.",
         "tool_calls": [
             {"id": f"call_{tok}_0_0", "type": "function",
              "function": {"name": "write_file", "arguments": json.dumps({"path": f"notes/{tok}.txt", "content": f"token {tok}\n"})}},
             {"id": f"call_{tok}_0_1", "type": "function",
              "function": {"name": "terminal", "arguments": json.dumps({"command": "cat /etc/hostname"})}}]},
        {"role": "tool", "tool_call_id": f"call_{tok}_0_0", "name": "write_file",
         "content": json.dumps({"success": True, "path": f"/workspace/notes/{tok}.txt", "bytes_written": 15})},
        {"role": "tool", "tool_call_id": f"call_{tok}_0_1", "name": "terminal",
         "content": json.dumps({"output": "hermes-bench-3f2a9c", "exit_code": 0, "error": None})},
        {"role": "assistant", "content": None,
         "reasoning": "Step 1: the previous results are in; next I call read_file.",
         "tool_calls": [{"id": f"call_{tok}_1_0", "type": "function",
                         "function": {"name": "read_file", "arguments": json.dumps({"path": f"notes/{tok}.txt"})}}]},
        {"role": "tool", "tool_call_id": f"call_{tok}_1_0", "name": "read_file",
         "content": json.dumps({"content": f"1|token {tok}\n", "total_lines": 1})},
        {"role": "assistant", "content": f"Done. hostname=hermes-bench-3f2a9c; notes/{tok}.txt=1|token {tok}",
         "reasoning": "I saw 3 tool result(s) (write_file, terminal, read_file); time to summarise."},
    ]
    if status == "failed":
        msgs = msgs[:1]
    elif status == "discarded":
        msgs = [{k: v for k, v in m.items() if k != "reasoning"} for m in msgs]
    tool_stats, tool_error_counts = entry_tool_stats(msgs, ALL_TOOL_NAMES)
    entry = {
        "prompt_index": "@@IDX@@",
        "conversations": to_sharegpt(msgs, tools),
        "metadata": {"batch_num": "@@BATCH@@", "timestamp": "2026-01-15T10:30:00", "model": "mock-model"},
        "completed": status == "completed", "partial": False,
        "api_calls": 0 if status == "failed" else 3,
        "toolsets_used": ["terminal", "file"],
        "tool_stats": tool_stats, "tool_error_counts": tool_error_counts,
        "hermes": {"key": "@@KEY@@", "status": status,
                   "error": "model endpoint answered 500: injected failure" if status == "failed" else None,
                   "usage": {"prompt_tokens": 4812, "completion_tokens": 127, "total_tokens": 4939},
                   "elapsed": 1.234, "hallucinated_tools": hallucinated_tools(msgs, ALL_TOOL_NAMES),
                   "reasoning": reasoning_counts(msgs)},
    }
    return (json.dumps(entry, ensure_ascii=False) + "\n").replace('"@@IDX@@"', "@@IDX@@").replace('"@@BATCH@@"', "@@BATCH@@")


def _fill(template: str, i: int, batch: int) -> str:
    return (template.replace("@@IDX@@", str(i)).replace("@@BATCH@@", str(batch))
            .replace("@@KEY@@", _key(i)).replace("@@TOK@@", f"{i:08x}").replace("@@PROMPT@@", _prompt(i)))


def gen_merge(run_dir: Path, n: int, batch_size: int) -> dict:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    templates = {s: _template_entry(s) for s in ("completed", "failed", "discarded")}
    total = 0
    for b, start in enumerate(range(0, n, batch_size)):
        with open(run_dir / f"batch_{b}.jsonl", "w", encoding="utf-8") as f:
            lines = []
            for i in range(start, min(n, start + batch_size)):
                status = "failed" if i % 50 == 7 else "discarded" if i % 100 == 13 else "completed"
                lines.append(_fill(templates[status], i, b))
            text = "".join(lines)
            f.write(text)
            total += len(text.encode("utf-8"))
    manifest = {"run_name": run_dir.name, "distribution": "terminal_only", "batch_size": batch_size,
                "model": "mock-model", "dataset_file": "synthetic", "total_prompts": n}
    (run_dir / "run.json").write_text(json.dumps(manifest))
    return {"entries": n, "bytes": total, "files": -(-n // batch_size)}


def journal_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in run_dir.glob("batch_*.jsonl"))


def time_merge(run_dir: Path) -> dict:
    from hermes.run.merge import merge

    size = journal_bytes(run_dir)
    t0 = time.perf_counter()
    stats = merge(run_dir)
    dt = time.perf_counter() - t0
    return {"seconds": dt, "bytes": size, "mb_per_s": size / 1e6 / dt, "written": stats["trajectories_written"],
            "maxrss_mib": _maxrss_mib()}


# --------------------------------------------------------------------------- resume planning


def gen_resume(root: Path, rows: int, done: int, batch_size: int, run_name: str) -> dict:
    """root/dataset.jsonl (rows prompts) and root/data/<run_name>/batch_*.jsonl (the first `done` completed)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "dataset.jsonl", "w", encoding="utf-8") as f:
        for start in range(0, rows, 10_000):
            f.write("".join(json.dumps({"prompt": _prompt(i)}) + "\n" for i in range(start, min(rows, start + 10_000))))
    run_dir = root / "data" / run_name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    for b, start in enumerate(range(0, done, batch_size)):
        lines = []
        for i in range(start, min(done, start + batch_size)):
            p = _prompt(i)
            lines.append(json.dumps({
                "prompt_index": i,
                "conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": "<think>\nok\n</think>\nDone."}],
                "metadata": {"batch_num": b, "timestamp": "2026-01-15T10:30:00", "model": "mock-model"},
                "completed": True, "partial": False, "api_calls": 1, "toolsets_used": ["terminal", "file"],
                "tool_stats": {}, "tool_error_counts": {},
                "hermes": {"key": _key(i), "status": "completed", "error": None}}) + "\n")
        with open(run_dir / f"batch_{b}.jsonl", "w", encoding="utf-8") as f:
            f.write("".join(lines))
    (run_dir / "run.json").write_text(json.dumps({"run_name": run_name, "batch_size": batch_size,
                                                  "total_prompts": rows, "model": "mock-model"}))
    return {"rows": rows, "done": done, "journal_bytes": journal_bytes(run_dir),
            "dataset_bytes": (root / "dataset.jsonl").stat().st_size}


def time_plan(root: Path, run_name: str, cold: bool) -> dict:
    """hermes.run.session-style planning, step by step.

    Keys kept for bench/report.py: load_rows = reading and checking the dataset (read_dataset,
    or load_rows before it existed); open_index = RunIndex; done_keys = the dataset's keys into
    DuckDB (load_dataset; before: fetching the done keys); difference = owed rows as full Rows
    (before: the set difference); checkpoint = what RunSession.plan() adds.
    """
    from hermes.run import rundir
    from hermes.data.run_index import RunIndex

    run_dir = root / "data" / run_name
    if cold:
        for p in run_dir.glob("index.duckdb*"):
            p.unlink()
    out: dict = {"cold": cold}
    t = time.perf_counter()
    try:
        from hermes.data.dataset import read_dataset
    except ImportError:  # a snapshot from before read_dataset (HERMES_BENCH_SRC)
        return _time_plan_rows(root, run_dir, run_name, out, t)
    dataset = read_dataset(root / "dataset.jsonl")
    out["load_rows"] = time.perf_counter() - t
    t1 = time.perf_counter()
    index = RunIndex(run_dir)          # cold: indexes every batch file; warm: checks sizes only
    out["open_index"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    index.load_dataset(dataset)
    out["done_keys"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    owed = dataset.rows(index.owed())
    out["difference"] = time.perf_counter() - t3
    out["plan_total"] = time.perf_counter() - t
    t4 = time.perf_counter()
    if hasattr(index, "completed_bitmap"):  # the checkpoint written in chunks (since issue 34's fifth pass)
        from hermes.data import bitmap
        completed = bitmap.chunks(index.completed_bitmap(len(dataset)))
    else:
        completed = index.completed_json()
    rundir.write_checkpoint(run_dir, run_name, completed, index.batch_stats())
    out["checkpoint"] = time.perf_counter() - t4
    done = index.con.execute("SELECT count(DISTINCT key) FROM outcomes WHERE status <> 'failed'").fetchone()[0]
    index.close()
    out.update(rows=len(dataset), done=done, owed=len(owed), maxrss_mib=_maxrss_mib())
    return out


def _time_plan_rows(root: Path, run_dir: Path, run_name: str, out: dict, t: float) -> dict:
    """The same steps with the API before read_dataset: every row a Row, sets in Python."""
    from hermes.run import rundir
    from hermes.data.dataset import load_rows
    from hermes.data.run_index import RunIndex

    rows, _ = load_rows(root / "dataset.jsonl")
    out["load_rows"] = time.perf_counter() - t
    t1 = time.perf_counter()
    index = RunIndex(run_dir)
    out["open_index"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    done = index.done_keys()
    out["done_keys"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    owed = [r for r in rows if r.key not in done]
    out["difference"] = time.perf_counter() - t3
    out["plan_total"] = time.perf_counter() - t
    t4 = time.perf_counter()
    completed = [r.index for r in rows if r.key in done]
    rundir.write_checkpoint(run_dir, run_name, completed, index.batch_stats())
    out["checkpoint"] = time.perf_counter() - t4
    index.close()
    out.update(rows=len(rows), done=len(done), owed=len(owed), maxrss_mib=_maxrss_mib())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.datascale")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen-merge"); g.add_argument("dir"); g.add_argument("--n", type=int, default=100_000)
    g.add_argument("--batch-size", type=int, default=100)
    m = sub.add_parser("merge"); m.add_argument("dir")
    r = sub.add_parser("gen-resume"); r.add_argument("dir"); r.add_argument("--rows", type=int, default=1_000_000)
    r.add_argument("--done", type=int, default=990_000); r.add_argument("--batch-size", type=int, default=1000)
    r.add_argument("--run-name", default="resume")
    pl = sub.add_parser("plan"); pl.add_argument("dir"); pl.add_argument("--cold", action="store_true")
    pl.add_argument("--run-name", default="resume")
    a = p.parse_args(argv)
    if a.cmd == "gen-merge":
        res = gen_merge(Path(a.dir), a.n, a.batch_size)
    elif a.cmd == "merge":
        res = time_merge(Path(a.dir))
    elif a.cmd == "gen-resume":
        res = gen_resume(Path(a.dir), a.rows, a.done, a.batch_size, a.run_name)
    else:
        res = time_plan(Path(a.dir), a.run_name, a.cold)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
