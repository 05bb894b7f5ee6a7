"""--attempt_policy all | first_pass | informative side by side, and a kill storm (issue 46).

    python -m bench.attempt_policy --tasks 40 --attempts 8 --num_workers 8 --output bench/attempt_policy_results.json

A task set with known solve chances: a quarter of the tasks each at p = 0.9, 0.5, 0.1 and 0 (the
bundled model's branched scripts, mockllm.branches: an attempt passes when a draw from its seed is
under p; hermes sends each attempt its own seed under --sampling_seed, so every policy and every
rerun sees the same verdict for the same attempt). Each task is a JSONL row with a `check`; the
pass branch writes solved.txt, the fail branch does not. The model answers after --latency
seconds a request (its thinking time). One process of

    python batch_runner.py --dataset_file D --attempts 8 --sampling_seed 1 --attempt_policy POLICY
        --num_workers W --batch_size B --engine direct --sandbox_backend local --distribution terminal_only

per policy (all, first_pass, informative --min_attempts 2; the order alternates over --repeats),
each timed (wall, 1-minute load average before and after). From each journal: attempts spent,
tasks solved, attempts per task by p, groups with signal (a pass and a fail). Then kill storms
(--storms, first_pass at P = 1 and 2 by default): a run SIGKILLed a random 0-1.5 s (seeded) after
each invocation's first new journal line, --kills times, resumed each time, until one finishes:
every attempt exactly one journal line, and (P = 1) the same attempts and verdicts as the
uninterrupted run of that variant.

The local sandbox backend (model commands in a folder on this host) keeps it fast: the policy
decides how many attempts run, not how a sandbox starts; sandboxes are measured in
bench/SANDBOX_REPORT.md.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHANCES = (0.9, 0.5, 0.1, 0.0)
SOLVE = {"reasoning": "Solve.", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo ok > solved.txt"}}]}
MISS = {"reasoning": "Guess.", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo no > guess.txt"}}]}
DONE = {"reasoning": "Report.", "content": "Done."}


def log(msg: str) -> None:
    print(f"[attempt_policy {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def expected_attempts(p: float, k: int) -> float:
    """E[min(first pass, k)] for attempts that pass with chance p each: (1 - (1-p)^k) / p."""
    return float(k) if p == 0 else (1 - (1 - p) ** k) / p


def expected_signal(p: float, k: int, m: int | None) -> float:
    """Chance a task's group ends with a pass and a fail: K attempts (all), or informative's m first and
    then more until the first pass (up to K)."""
    if m is None:
        return 1 - p ** k - (1 - p) ** k
    return 1 - p ** m - (1 - p) ** m + (1 - p) ** m * (1 - (1 - p) ** (k - m))


def write_tasks(path: Path, n: int) -> dict[str, float]:
    """n rows, a quarter at each chance; returns {task: p}."""
    chances, lines = {}, []
    for i in range(n):
        p = CHANCES[i * len(CHANCES) // n]
        name = f"t{i:03d}-p{p:g}"
        script = {"pass": {"turns": [SOLVE, DONE]}, "fail": {"turns": [MISS, DONE]}, "pass_chance": p}
        lines.append(json.dumps({"prompt": f"Task {name}: write ok to solved.txt. MOCK_SCRIPT: {json.dumps(script)}",
                                 "case": name, "p": p, "check": "grep -qx ok solved.txt"}))
        chances[name] = p
    path.write_text("\n".join(lines) + "\n")
    return chances


def command(a: argparse.Namespace, dataset: Path, out: Path, name: str, url: str, variant: str) -> list[str]:
    """variant: a policy, then -pN for --attempt_parallelism N, -bN for --attempt_budget N (first_pass-p2-b120)."""
    policy, *knobs = variant.split("-")
    cmd = [sys.executable, "batch_runner.py", "--dataset_file", str(dataset), "--run_name", name,
           "--output_dir", str(out), "--base_url", url, "--model", "mock-model", "--attempts", str(a.attempts),
           "--sampling_seed", "1", "--attempt_policy", policy, "--num_workers", str(a.num_workers),
           "--batch_size", str(a.batch_size), "--engine", "direct", "--sandbox_backend", "local",
           "--distribution", "terminal_only"]
    flags = {"p": "--attempt_parallelism", "b": "--attempt_budget"}
    for knob in knobs:
        cmd += [flags[knob[0]], knob[1:]]
    return cmd + (["--min_attempts", str(a.min_attempts)] if policy == "informative" else [])


def journal(out: Path, name: str) -> list[dict]:
    lines = []
    for path in sorted((out / name).glob("batch_*.jsonl")):
        for text in path.read_text().splitlines():
            if text.strip():
                try:
                    lines.append(json.loads(text))
                except ValueError:  # a line cut by a kill would be a bug: counted, not hidden
                    lines.append({"torn": text[:200]})
    return lines


def groups(lines: list[dict]) -> dict[str, list[tuple[int, str, bool | None]]]:
    """Per task: (attempt, status, check passed) by attempt."""
    out: dict[str, list] = {}
    for e in lines:
        if "torn" in e:
            continue
        out.setdefault(e["metadata"]["case"], []).append(
            (e["hermes"].get("trial", 1), e["hermes"]["status"], (e.get("reward") or {}).get("passed")))
    return {t: sorted(v) for t, v in sorted(out.items())}


def measure(lines: list[dict], chances: dict[str, float], k: int) -> dict[str, Any]:
    g = groups(lines)
    spent = {t: sum(1 for _, s, _ in v if s != "stopped") for t, v in g.items()}
    solved = {t for t, v in g.items() if any(p for _, _, p in v)}
    signal_ = {t for t, v in g.items() if any(p for _, _, p in v) and any(p is False for _, _, p in v)}
    by_p = {}
    for p in CHANCES:
        tasks = [t for t, q in chances.items() if q == p]
        by_p[f"{p:g}"] = {"tasks": len(tasks), "solved": sum(t in solved for t in tasks),
                          "attempts_per_task": round(sum(spent.get(t, 0) for t in tasks) / max(1, len(tasks)), 3),
                          "expected_first_pass": round(expected_attempts(p, k), 3)}
    # attempts numbered after a task's first pass: under first_pass none at P = 1, at most the P - 1
    # siblings already in flight at P > 1 (informative's m first attempts may follow a pass)
    after = [sum(1 for n, _, _ in v if n > min(n for n, _, p in v if p)) for v in g.values() if any(p for _, _, p in v)]
    keys = [e["hermes"]["key"] for e in lines if "torn" not in e]
    return {"lines": len(lines), "torn_lines": sum("torn" in e for e in lines),
            "duplicate_keys": len(keys) - len(set(keys)), "attempts": sum(spent.values()),
            "stopped": sum(1 for v in g.values() for _, s, _ in v if s == "stopped"),
            "statuses": sorted({s for v in g.values() for _, s, _ in v}), "tasks_solved": len(solved),
            "groups_with_signal": len(signal_), "most_after_first_pass": max(after, default=0), "solved": sorted(solved), "by_p": by_p}


def one_run(a, dataset: Path, out: Path, name: str, url: str, policy: str, chances: dict[str, float]) -> dict:
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    p = subprocess.run(command(a, dataset, out, name, url, policy), cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - t0
    res = {"policy": policy, "run_name": name, "rc": p.returncode, "wall_s": round(wall, 2),
           "load1_before": round(load0, 2), "load1_after": round(os.getloadavg()[0], 2)}
    if p.returncode:
        res["error"] = (p.stdout + p.stderr)[-2000:]
    res.update(measure(journal(out, name), chances, a.attempts))
    try:
        stats = json.loads((out / name / "statistics.json").read_text())
        res["statistics_attempt_policy"] = stats.get("attempt_policy")
        ts = stats.get("task_statistics") or {}
        res["pass_at_k"] = ts.get("pass_at_k")
        res["pass_at_k_absent"] = ts.get("pass_at_k_absent")
    except (OSError, ValueError) as e:
        res["statistics_error"] = str(e)
    log(f"{policy:11s} {wall:7.2f} s  attempts {res['attempts']:4d}  solved {res['tasks_solved']}  "
        f"stopped {res['stopped']}  signal {res['groups_with_signal']}  load {load0:.2f}->{res['load1_after']:.2f}  rc {p.returncode}")
    return res


def kill_storm(a, dataset: Path, out: Path, url: str, chances: dict[str, float], variant: str) -> dict:
    """SIGKILL a run at random moments, resume it, until one invocation finishes."""
    rng = random.Random(a.seed)
    name, kills, starts, t0 = f"storm-{variant}", 0, 0, time.monotonic()
    log_path = out / "storm.log"
    while True:
        cmd = command(a, dataset, out, name, url, variant) + (["--resume"] if starts else [])
        starts += 1
        with open(log_path, "ab") as f:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        if kills < a.kills:  # once this invocation has written a line, kill it a random moment later
            before = len(journal(out, name))
            while proc.poll() is None and len(journal(out, name)) <= before:
                time.sleep(0.02)
            time.sleep(rng.uniform(a.kill_min, a.kill_max))
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                kills += 1
                log(f"storm: kill {kills} after {len(journal(out, name))} journal lines")
                continue
        rc = proc.wait()
        if rc != 0:
            return {"error": f"rc {rc}", "log": log_path.read_text()[-2000:], "kills": kills}
        break
    res = {"variant": variant, "run_name": name, "kills": kills, "invocations": starts, "wall_s": round(time.monotonic() - t0, 2)}
    res.update(measure(journal(out, name), chances, a.attempts))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--attempts", type=int, default=8)
    ap.add_argument("--num_workers", type=int, default=8)
    ap.add_argument("--batch_size", type=int, default=10)
    ap.add_argument("--min_attempts", type=int, default=2)
    ap.add_argument("--latency", type=float, default=0.2, help="the model's seconds per request")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--policies", default="all,first_pass,informative",
                    help="comma-separated; POLICY-pN adds --attempt_parallelism N, -bN --attempt_budget N")
    ap.add_argument("--kills", type=int, default=8, help="SIGKILLs in each storm")
    ap.add_argument("--storms", default="first_pass,first_pass-p2", help="variants to storm (comma-separated; empty: none)")
    ap.add_argument("--kill_min", type=float, default=0.0, help="seconds after an invocation's first new line")
    ap.add_argument("--kill_max", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=46, help="the storm's kill times")
    ap.add_argument("--output", type=Path, help="write the raw results here (JSON)")
    a = ap.parse_args(argv)

    from mockllm import MockLLM

    scratch = Path(tempfile.mkdtemp(prefix="attempt-policy-bench-"))
    dataset = scratch / "tasks.jsonl"
    chances = write_tasks(dataset, a.tasks)
    runs: list[dict] = []
    policies = a.policies.split(",")
    try:
        with MockLLM(latency=a.latency) as llm:
            log(f"mock model at {llm.base_url}; {a.tasks} tasks; scratch {scratch}; load {os.getloadavg()}")
            for rep in range(a.repeats):
                order = policies if rep % 2 == 0 else policies[::-1]
                for policy in order:
                    runs.append({"repeat": rep, **one_run(a, dataset, scratch, f"{policy}-r{rep}", llm.base_url,
                                                          policy, chances)})
            storms = []
            for variant in filter(None, a.storms.split(",")):
                storm = kill_storm(a, dataset, scratch, llm.base_url, chances, variant)
                clean = journal(scratch, f"{variant}-r0")
                # P = 1: the same attempts and verdicts; P > 1: which siblings a pass stops is timing
                storm["same_as_uninterrupted"] = bool(clean) and groups(journal(scratch, storm["run_name"])) == groups(clean)
                storm["same_solved_as_uninterrupted"] = bool(clean) and storm.get("solved") == measure(
                    clean, chances, a.attempts)["solved"]
                storms.append(storm)
                log(f"storm: {json.dumps({k: v for k, v in storm.items() if k not in ('by_p', 'solved')})}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = summarise(runs, a)
    log(json.dumps(summary))
    if a.output:
        a.output.write_text(json.dumps({"args": vars(a) | {"output": str(a.output)}, "runs": runs, "storms": storms,
                                        "summary": summary, "nproc": os.cpu_count()}, indent=1) + "\n")
    return 0


def summarise(runs: list[dict], a) -> dict:
    """Per policy over repeats: mean attempts, solved, wall; first_pass's saving against all."""
    out: dict[str, Any] = {}
    for policy in {r["policy"] for r in runs}:
        mine = [r for r in runs if r["policy"] == policy]
        out[policy] = {field: [r[field] for r in mine]
                       for field in ("attempts", "stopped", "tasks_solved", "wall_s", "groups_with_signal")}
    if "all" in out and "first_pass" in out:
        spent_all, spent_fp = sum(out["all"]["attempts"]), sum(out["first_pass"]["attempts"])
        out["first_pass_attempts_saved_pct"] = round(100 * (1 - spent_fp / spent_all), 1) if spent_all else None
        expected = sum(expected_attempts(p, a.attempts) for p in CHANCES) / len(CHANCES)
        out["expected_saved_pct"] = round(100 * (1 - expected / a.attempts), 1)
        # the same seeds give an attempt the same verdict under every policy: first_pass reaches the
        # first passing attempt of each task, so it solves exactly the tasks `all` solves
        out["same_tasks_solved"] = all(r["solved"] == s["solved"] for r in runs if r["policy"] == "first_pass"
                                       for s in runs if s["policy"] == "all" and s["repeat"] == r["repeat"])
    tasks = a.tasks / len(CHANCES)
    out["expected_groups_with_signal"] = {
        "all": round(sum(tasks * expected_signal(p, a.attempts, None) for p in CHANCES), 1),
        "informative": round(sum(tasks * expected_signal(p, a.attempts, a.min_attempts) for p in CHANCES), 1)}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
