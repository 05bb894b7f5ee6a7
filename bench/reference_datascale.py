"""Workload 5, the reference's side. Run with the reference's own interpreter (its venv):

    bench/.venv-reference/bin/python bench/reference_datascale.py merge RUN_DIR
    bench/.venv-reference/bin/python bench/reference_datascale.py plan ROOT RUN_NAME   (cwd: ROOT)

`merge`: the reference has no merge command; its merge is the "Combine ALL batch files" block at
the end of BatchRunner.run() (batch_runner.py of hermes-agent 0.19.0, lines 1025-1066). That
block is reproduced below line for line (prints dropped), with its own VALID_TOOLS
(batch_runner.ALL_POSSIBLE_TOOLS). Its statistics.json is built from worker results held in
memory, not from the batch files, so a merge of files alone is all it does here.

`plan`: the reference's own resume planning, called on its own objects: BatchRunner.__init__
(loads the dataset), _scan_completed_prompts_by_content() and _filter_dataset_by_completed().
Prints one JSON object.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys
import time
from pathlib import Path


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def merge(run_dir: Path) -> dict:
    import batch_runner  # the reference's module

    VALID_TOOLS = batch_runner.ALL_POSSIBLE_TOOLS
    size = sum(p.stat().st_size for p in run_dir.glob("batch_*.jsonl"))
    t0 = time.perf_counter()
    # ---- from BatchRunner.run(), verbatim but for print() calls ----
    combined_file = run_dir / "trajectories.jsonl"
    total_entries = 0
    filtered_entries = 0
    batch_files_found = 0
    all_batch_files = sorted(run_dir.glob("batch_*.jsonl"))
    with open(combined_file, 'w', encoding='utf-8') as outfile:
        for batch_file in all_batch_files:
            batch_files_found += 1
            batch_num = batch_file.stem.split("_")[1]  # noqa: F841
            with open(batch_file, 'r', encoding='utf-8') as infile:
                for line in infile:
                    total_entries += 1
                    try:
                        data = json.loads(line)
                        tool_stats = data.get('tool_stats', {})
                        invalid_tools = [k for k in tool_stats if k not in VALID_TOOLS]
                        if invalid_tools:
                            filtered_entries += 1
                            continue
                        outfile.write(line)
                    except json.JSONDecodeError:
                        filtered_entries += 1
    # ---- end ----
    dt = time.perf_counter() - t0
    return {"seconds": dt, "bytes": size, "mb_per_s": size / 1e6 / dt,
            "written": total_entries - filtered_entries, "maxrss_mib": _maxrss_mib()}


def plan(root: Path, run_name: str) -> dict:
    os.chdir(root)  # the reference writes to ./data/<run_name>
    from batch_runner import BatchRunner

    out: dict = {}
    sink = io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stdout(sink):
        runner = BatchRunner(dataset_file=str(root / "dataset.jsonl"), batch_size=1000, run_name=run_name,
                             distribution="terminal_only")
    out["load_rows"] = time.perf_counter() - t
    t1 = time.perf_counter()
    with contextlib.redirect_stdout(sink):
        completed = runner._scan_completed_prompts_by_content()
    out["scan_journal"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    owed, skipped = runner._filter_dataset_by_completed(completed)
    out["difference"] = time.perf_counter() - t2
    out["plan_total"] = time.perf_counter() - t
    out.update(rows=len(runner.dataset), done=len(completed), owed=len(owed), maxrss_mib=_maxrss_mib())
    return out


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "merge":
        res = merge(Path(sys.argv[2]))
    elif cmd == "plan":
        res = plan(Path(sys.argv[2]).resolve(), sys.argv[3])
    else:
        raise SystemExit(f"unknown command {cmd}")
    print(json.dumps(res))
