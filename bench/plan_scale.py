"""Planning a dataset that does not fit in memory comfortably (issue 34): a run's start over a
multi-gigabyte JSONL, and a walk over its whole plan, without holding every row's text.

    python -m bench.plan_scale --rows 1000000 --row-bytes 5000      # about 5 GB

Each measurement runs in a fresh process: RunSession.open (check every line, hash it, load the
keys into the run's DuckDB index), RunSession.plan (number the rows owed), then a walk over every
batch of the plan reading its rows' text back from the file and letting it go, as a run's
hand-out does. Prints the process's peak RSS (VmHWM) after each step, the seconds each took, and
the file's size; --output appends the JSON line to a file. The dataset is written once under
--scratch and reused.
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

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
from pathlib import Path
from hermes.run.session import RunSession
from hermes.settings import RunSettings

def hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) // 1024

data, out = sys.argv[1], sys.argv[2]
report = {"start_mib": hwm()}
t = time.monotonic()
settings = RunSettings(dataset_file=data, run_name="plan-scale", output_dir=out, batch_size=10,
                       sandbox={"backend": "local"}, distribution="terminal_only")
session = RunSession.open(settings, api_key="unused")
report.update(open_s=round(time.monotonic() - t, 1), open_mib=hwm())
t = time.monotonic()
plan = session.plan()
report.update(plan_s=round(time.monotonic() - t, 1), plan_mib=hwm(), batches=len(plan), owed=plan.prompts)
t = time.monotonic()
walked = text = 0
for batch in plan:
    rows = batch.rows
    walked += len(rows)
    text += sum(len(r.row.prompt) for r in rows)
    batch.release()
report.update(walk_s=round(time.monotonic() - t, 1), walk_mib=hwm(), rows_walked=walked,
              text_read_mib=round(text / 2 ** 20))
session.close()
print(json.dumps(report))
"""


def write_dataset(path: Path, rows: int, row_bytes: int) -> None:
    filler = ("lorem ipsum dolor sit amet " * (row_bytes // 27 + 1))[:max(row_bytes - 40, 1)]
    with path.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"prompt": f"prompt {i}: {filler}"}) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--row-bytes", type=int, default=5000)
    p.add_argument("--scratch", default=tempfile.gettempdir())
    p.add_argument("--output", default=None)
    a = p.parse_args(argv)
    scratch = Path(a.scratch)
    data = scratch / f"plan-scale-{a.rows}x{a.row_bytes}.jsonl"
    if not data.exists():
        t = time.monotonic()
        write_dataset(data, a.rows, a.row_bytes)
        print(f"wrote {data} ({data.stat().st_size / 2 ** 30:.2f} GiB) in {time.monotonic() - t:.0f}s", flush=True)
    with tempfile.TemporaryDirectory(prefix="plan-scale-", dir=scratch) as out:
        done = subprocess.run([sys.executable, "-c", CHILD, str(data), out], cwd=REPO, capture_output=True,
                              text=True, env={**os.environ, "HERMES_API_KEY": "k"})
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return done.returncode
    report = {"rows": a.rows, "row_bytes": a.row_bytes, "file_gib": round(data.stat().st_size / 2 ** 30, 2),
              **json.loads(done.stdout.strip().splitlines()[-1])}
    print(json.dumps(report), flush=True)
    if a.output:
        with open(a.output, "a") as f:
            f.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
