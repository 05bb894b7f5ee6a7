"""--publish's cost and latency: workload 1's shape with and without publishing to a local S3 server.

    python -m bench.publish_bench --repeats 5            # goodput, side by side (off, on, off, on, ...)
    python -m bench.publish_bench --repeats 2 --every 1  # plus time from landing to visibility

Workload 1's shape (bench/REPORT.md): 200 prompts, --num_workers 4, batches of 50, 3 model calls each
at zero latency (bench.mockserver, its own process), the local sandbox backend (no container), the
direct engine. With publishing, the run writes to moto's S3 server (`moto_server`, its own process on
loopback) through s3fs, the endpoint and keys from the environment as a user's would be.

Goodput: prompts per second end to end (launch to exit) and between the first and the last model call
(the run's steady part, where publishing must not slow the prompts); pairs alternate so that the
machine's drift falls on both. Visibility: with --every, a poller lists the bucket every 100 ms (its
own runs: the listing loads the S3 server) and notes when each
shard first appears; an entry's landing is its batch file's last write (the batch landing), and its
delay is the first listing that shows a shard holding it, minus that.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import MockServer

REPO = Path(__file__).resolve().parent.parent
ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_s3(scratch: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(scratch / "moto.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    import boto3

    for _ in range(200):
        try:
            boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="bench",
                         aws_secret_access_key="bench").create_bucket(Bucket="bench")
            return proc, url
        except Exception:  # noqa: BLE001 (not up yet)
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto_server did not start")


def dataset(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"Task {i}: inspect the machine, take notes and report."}) + "\n"
                            for i in range(n)))
    return path


class Poller(threading.Thread):
    """Lists the bucket prefix every 100 ms; first time each shard is seen."""

    def __init__(self, endpoint: str, prefix: str):
        super().__init__(daemon=True)
        import s3fs

        self.fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="bench", secret="bench")
        self.prefix, self.seen, self.stop = prefix, {}, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                for p in self.fs.ls(f"{self.prefix}/data", refresh=True):
                    self.seen.setdefault(Path(p).name, time.time())
            except FileNotFoundError:
                pass
            time.sleep(0.1)


def one(scratch: Path, n: int, publish: bool, tag: str, endpoint: str, every: str | None) -> dict:
    run_name = f"pub-{tag}"
    out = scratch / "runs"
    mock = MockServer(latency=0.0, turns=3, log_path=scratch / f"{run_name}.mock.log")
    url = mock.start()
    cmd = [sys.executable, str(REPO / "batch_runner.py"), "--dataset_file", str(scratch / "prompts.jsonl"),
           "--batch_size", "50", "--run_name", run_name, "--distribution", "terminal_only", "--model", "mock-model",
           "--base_url", url, "--num_workers", "4", "--max_turns", "10", "--output_dir", str(out),
           "--sandbox_backend", "local", "--engine", "direct", "--api_key", "bench"]
    poller = None
    if publish:
        cmd += ["--publish", f"s3://bench/{run_name}"] + (["--publish_every", every] if every else [])
        if every:  # latency runs only: the listing loads the S3 server, which the goodput runs must not pay
            poller = Poller(endpoint, f"bench/{run_name}")
            poller.start()
    env = {**os.environ, **ENV, "AWS_ENDPOINT_URL": endpoint, "PYTHONPATH": str(REPO)}
    try:
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.time()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=scratch)
        t1 = time.time()
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the run and its publishing worker, not the mock
        times = mock.times()
    finally:
        mock.stop()
        if poller:
            time.sleep(0.2)
            poller.stop.set()
            poller.join()
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    result = {"publish": publish, "load": os.getloadavg()[0], "wall": t1 - t0, "cpu": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), "goodput": n / (t1 - t0),
              "steady": n / max(times["last"] - times["first"], 1e-9), "window": times["last"] - times["first"]}
    if poller:
        result["delays"] = delays(out / run_name, poller.seen)
    return result


def delays(run: Path, seen: dict[str, float]) -> list[float]:
    """Per entry: first listing that shows a shard holding it, minus its batch file's last write."""
    state = next((run / "publish").glob("*/state.jsonl"))
    landed = {int(p.stem.split("_")[1]): p.stat().st_mtime for p in run.glob("batch_*.jsonl")}
    first: dict[int, float] = {}  # batch -> first time a shard with its range was seen
    for line in state.read_text().splitlines():
        step = json.loads(line)
        if step.get("name") in seen:
            for num, _, _ in step["ranges"]:
                first[num] = min(first.get(num, float("inf")), seen[step["name"]])
    out = []
    for num, at in first.items():
        entries = sum(1 for _ in open(run / f"batch_{num}.jsonl"))
        out += [at - landed[num]] * entries
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.publish_bench")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--every", default=None, help="--publish_every of the runs with publishing (default: the run's)")
    p.add_argument("--scratch", default="/tmp/hermes-publish-bench")
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args(argv)
    scratch = Path(a.scratch) / str(int(time.time()))
    scratch.mkdir(parents=True)
    dataset(scratch / "prompts.jsonl", a.prompts)
    s3, endpoint = start_s3(scratch)
    runs = []
    try:
        one(scratch, a.prompts, True, "warm", endpoint, a.every)  # imports and caches warm, both sides
        for i in range(a.repeats):
            for publish in (False, True) if i % 2 == 0 else (True, False):
                r = one(scratch, a.prompts, publish, f"{i}-{int(publish)}", endpoint, a.every)
                runs.append(r)
                print(f"run {i} publish={publish}: wall {r['wall']:.2f} s, {r['goodput']:.1f} prompts/s end to end, "
                      f"{r['steady']:.1f} steady, CPU {r['cpu']:.2f} s, load {r['load']:.1f}", flush=True)
    finally:
        s3.kill()
    summary = {}
    for key in ("goodput", "steady", "wall", "cpu"):
        on = [r[key] for r in runs if r["publish"]]
        off = [r[key] for r in runs if not r["publish"]]
        pairs = [runs[j][key] / runs[j + 1][key] if runs[j]["publish"] else runs[j + 1][key] / runs[j][key]
                 for j in range(0, len(runs), 2)]
        summary[key] = {"on_median": statistics.median(on), "off_median": statistics.median(off),
                        "on/off pairs": [round(x, 3) for x in pairs], "on/off median": statistics.median(pairs)}
        print(f"{key}: with {statistics.median(on):.2f}, without {statistics.median(off):.2f}; "
              f"ratio per pair {[round(x, 3) for x in pairs]}, median {statistics.median(pairs):.3f}")
    loads = [r["load"] for r in runs]
    summary["load"] = {"min": min(loads), "median": statistics.median(loads), "max": max(loads)}
    print(f"load average (1 min) at the runs' ends: {min(loads):.1f}-{max(loads):.1f}, median {statistics.median(loads):.1f}")
    d = sorted(x for r in runs if r.get("delays") for x in r["delays"])
    if d:
        summary["visibility_s"] = {"median": statistics.median(d), "p90": d[int(0.9 * (len(d) - 1))], "max": d[-1]}
        print(f"landing -> visible: median {summary['visibility_s']['median']:.2f} s, "
              f"p90 {summary['visibility_s']['p90']:.2f} s, max {d[-1]:.2f} s over {len(d)} entries")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
