"""Benchmarks of hermes-batch against the reference system (hermes-agent 0.19.0) and the machine.

    python -m bench                       # every workload at the issue's sizes, 3 repeats
    python -m bench --quick               # small sizes, 1 repeat: a smoke check (~5 min)
    python -m bench --workloads 1,5 --repeats 2 --w1-prompts 100
    python bench/run.py --help

Each workload runs on both systems in the same invocation, repeats interleaved (reference, ours,
reference, ours, ...), against the same scripted model server (bench/mockserver.py: the bundled
mockllm plus timestamps) started afresh for every run. Docker workloads also measure
the machine's sandbox limit (bench/sandbox_limit.py) beside each pair. Writes bench/REPORT.md
and bench/results.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.runlogs import ours_phases, prompt_stats  # noqa: E402
from bench.common import (  # noqa: E402
    BENCH, REFERENCE_LABEL, REPO, MockServer, PrefectServer, log, machine_facts, other_load_sample,
    remove_containers, run_measured,
)

REFERENCE_VERSION = "0.19.0"
VENV = BENCH / ".venv-reference"
BENCH_IMAGE = "hermes-bench-sandbox:latest"
BASE_IMAGE = "hermes-sandbox-mini:latest"  # the static busybox image (once named hermes-sandbox:latest)
#: the systems compared: "ours" as a user runs it by default (a Prefect flow on the local background
#: server of its PREFECT_HOME, which the first run of "ours", the warm-up, starts and the others reuse),
#: "ours-server" with a standing `prefect server start` (PREFECT_API_URL), "ours-direct" with --engine direct
#: "ours-direct-2p": --engine direct over two worker processes of this machine (--worker_processes 2)
SHORT = {"reference": "ref", "ours": "our", "ours-server": "srv", "ours-direct": "dir", "ours-direct-2p": "d2p"}


# --------------------------------------------------------------------------- set-up


def sh(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def ensure_reference() -> Path:
    """hermes-agent==0.19.0 in its own venv (git-ignored); returns its python."""
    py = VENV / "bin" / "python"
    ok = py.exists() and subprocess.run(
        [str(py), "-c", f"import importlib.metadata as m; assert m.version('hermes-agent') == '{REFERENCE_VERSION}'"],
        capture_output=True).returncode == 0
    if not ok:
        log(f"installing hermes-agent=={REFERENCE_VERSION} into {VENV} (a minute or two)")
        sh([sys.executable, "-m", "venv", str(VENV)])
        sh([str(py), "-m", "pip", "install", "-q", f"hermes-agent=={REFERENCE_VERSION}"])
    return py


def ensure_images() -> None:
    """Our small busybox image, plus a bench image = it + a static bash (the reference's docker
    backend runs everything through `bash`, which the busybox image lacks). Both systems use the
    bench image."""
    sh([sys.executable, "-m", "hermes.sandbox.image", "ensure", "--tag", BASE_IMAGE], cwd=REPO,
       stdout=subprocess.DEVNULL)
    if subprocess.run(["docker", "image", "inspect", BENCH_IMAGE], capture_output=True).returncode == 0:
        return
    log(f"building {BENCH_IMAGE}: {BASE_IMAGE} + bash-static (Debian package)")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        sh(["apt-get", "download", "bash-static"], cwd=d, capture_output=True)
        deb = next(d.glob("bash-static_*.deb"))
        sh(["dpkg-deb", "-x", str(deb), str(d / "x")])
        (d / "ctx" / "bin").mkdir(parents=True)
        shutil.copy2(d / "x" / "bin" / "bash-static", d / "ctx" / "bin" / "bash")
        (d / "ctx" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nCOPY bin/bash /bin/bash\nLABEL hermes-bench.image=1\n")
        sh(["docker", "build", "-q", "-t", BENCH_IMAGE, str(d / "ctx")], capture_output=True)


PRODUCT_PATHS = ["batch_runner.py", "hermes", "flows", "tasks", "deployments", "prefect.yaml", "pyproject.toml"]


def product_source(scratch: Path, mode: str, ref: str = "HEAD") -> dict[str, Any]:
    """The code of ours that is measured. 'head' (default): `git archive HEAD` of the product's files
    into the scratch folder, so edits and commits landing in the work tree during a long benchmark do
    not change what is measured mid-run; 'live': the work tree as it is."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", ref)
    dirty = [l[3:] for l in git("status", "--porcelain", "--", *PRODUCT_PATHS).splitlines() if l.strip()]
    info = {"mode": mode, "commit": commit, "subject": git("log", "-1", "--format=%s", ref),
            "dirty_at_start": dirty, "path": str(REPO)}
    if mode == "head" and commit:
        dest = scratch / "ours-src"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        paths = [p for p in PRODUCT_PATHS if git("ls-tree", "--name-only", commit, "--", p)]
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, *paths], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
        info["path"] = str(dest)
    else:
        info["mode"] = "live"
    return info


def write_dataset(path: Path, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"Task {i}: inspect the machine, take notes and report."}) + "\n")


# --------------------------------------------------------------------------- the two systems


class Systems:
    def __init__(self, scratch: Path, ref_python: Path | None, server: PrefectServer | None = None,
                 src: Path = REPO):
        self.src = src
        self.scratch = scratch
        self.server = server
        self.ref_python = ref_python
        self.counter = 0
        self.ref_home = scratch / "reference-home"
        self.ref_hermes_home = scratch / "reference-hermes-home"
        self.prefect_home = scratch / "prefect-home"
        for d in (self.ref_home, self.ref_hermes_home, self.prefect_home):
            d.mkdir(parents=True, exist_ok=True)

    def _base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PREFECT_", "TERMINAL_", "OPENAI_", "OPENROUTER_", "HERMES_"))}
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def command(self, system: str, *, dataset: Path, run_name: str, workers: int, batch_size: int,
                url: str, docker: bool, out: Path) -> tuple[list[str], dict[str, str], Path]:
        common = ["--dataset_file", str(dataset), "--batch_size", str(batch_size), "--run_name", run_name,
                  "--distribution", "terminal_only", "--model", "mock-model", "--base_url", url,
                  "--num_workers", str(workers), "--max_turns", "10"]
        env = self._base_env()
        if system == "reference":
            env.update(HOME=str(self.ref_home), HERMES_HOME=str(self.ref_hermes_home),
                       TERMINAL_ENV="docker" if docker else "local")
            if docker:
                env["TERMINAL_DOCKER_IMAGE"] = BENCH_IMAGE
            return [str(self.ref_python), "-m", "batch_runner", *common, "--api_key", "bench"], env, out
        env["PREFECT_HOME"] = str(self.prefect_home)
        env["PYTHONPATH"] = str(self.src)
        if system == "ours-server":
            env["PREFECT_API_URL"] = self.server.api_url
        cmd = [sys.executable, str(self.src / "batch_runner.py"), *common, "--output_dir", str(out / "data"),
               "--sandbox_backend", "docker" if docker else "local", "--sandbox_image", BENCH_IMAGE]
        if system.startswith("ours-direct"):
            cmd += ["--engine", "direct"]
        if system == "ours-direct-2p":
            cmd += ["--worker_processes", "2"]
        return cmd, env, out

    def run(self, system: str, *, n: int, workers: int, latency: float, turns: int, docker: bool,
            tag: str, timeout: float, mock_options: tuple = (), batch_size: int | None = None) -> dict[str, Any]:
        self.counter += 1
        run_name = f"hbench-{tag}-{SHORT[system]}-{self.counter}"
        where = self.scratch / "runs" / run_name
        dataset = self.scratch / "datasets" / f"prompts-{n}.jsonl"
        if not dataset.exists():
            write_dataset(dataset, n)
        # the reference runs one process per batch; a caller may ask for smaller batches (bench.fanout)
        batch_size = batch_size or max(1, math.ceil(n / workers))
        mock = MockServer(latency=latency, turns=turns, log_path=where / "mock.log", options=mock_options)
        url = mock.start()
        try:
            cmd, env, cwd = self.command(system, dataset=dataset, run_name=run_name, workers=workers,
                                         batch_size=batch_size, url=url, docker=docker, out=where)
            server_cpu0 = self.server.cpu() if system == "ours-server" else 0.0
            m = run_measured(cmd, env=env, cwd=cwd, log_path=where / "output.log", timeout=timeout)
            if system == "ours-server":
                time.sleep(1.5)  # the server records the run's last task runs after the client exits
                m.extra["server_cpu"] = self.server.cpu() - server_cpu0
                m.cpu += m.extra["server_cpu"]
            times = mock.times()
            mock_stats = mock.stats()
            mock_cpu = mock.cpu()
        finally:
            mock.stop()
            if docker:
                if system == "reference":
                    remove_containers(REFERENCE_LABEL)
                else:
                    remove_containers(f"hermes-batch.run={run_name}")
        phases = ours_phases(Path(m.log_path), m.started, m.ended, times) if system != "reference" else {}
        traj = where / "data" / run_name / "trajectories.jsonl"
        pstats = prompt_stats(traj.parent) if system != "reference" else {}
        written = sum(1 for _ in open(traj, "rb")) if traj.exists() else 0
        stats_file = traj.parent / "statistics.json"
        run_stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
        first, last = times.get("first"), times.get("last")
        res = {
            "system": system, "n": n, "workers": workers, "latency": latency, "turns": turns, "docker": docker,
            "rc": m.rc, "wall": m.wall, "cpu": m.cpu, "peak_pss_mib": m.peak_pss_mib,
            "peak_rss_mib": m.peak_rss_mib, "peak_procs": m.peak_procs, "engine_cpu": m.engine_cpu,
            "machine_busy": m.machine_busy, "mock_cpu": mock_cpu, "chat_requests": times.get("chat"),
            "other_paths": times.get("other_paths"), "written": written,
            "ttfc": (first - m.started) if first else None,
            "steady": (last - first) if first and last and last > first else None,
            "prompts_per_s": n / m.wall, "cpu_per_prompt": m.cpu / n,
            "steady_prompts_per_s": (n / (last - first)) if first and last and last > first else None,
            "log": m.log_path, "command": " ".join(cmd), "batch_size": batch_size,
            "mock_stats": mock_stats, "retries": run_stats.get("retries"),
            "failure_reasons": run_stats.get("failure_reasons"), "prompts_failed": run_stats.get("prompts_failed"),
            "server_cpu": m.extra.get("server_cpu"), "phases": phases, "prompt_stats": pstats, "started": m.started, "ended": m.ended,
        }
        log(f"  {system:11s} {tag}: rc={m.rc} wall={m.wall:.1f}s {n / m.wall:.2f} prompts/s cpu/prompt={m.cpu / n:.3f}s "
            f"peak={m.peak_pss_mib:.0f}MiB ttfc={res['ttfc'] if res['ttfc'] is None else round(res['ttfc'], 2)}s "
            f"requests={times.get('chat')} written={written}")
        return res

    def sandbox_limit(self, concurrency: int, count: int) -> dict[str, Any]:
        out = subprocess.run([sys.executable, "-m", "bench.sandbox_limit", "--concurrency", str(concurrency),
                              "--count", str(count), "--image", BENCH_IMAGE],
                             cwd=REPO, capture_output=True, text=True, timeout=1800)
        remove_containers("hermes-bench")
        if out.returncode != 0:
            raise RuntimeError(f"sandbox limit loop failed: {out.stderr[-2000:]}")
        res = json.loads(out.stdout.strip().splitlines()[-1])
        log(f"  machine   limit c={concurrency}: {res['per_second']:.2f} sandboxes/s "
            f"(median life {res['median_life']:.2f}s, errors {res['errors']})")
        return res


def remove_our_bench_containers() -> int:
    """Our product's containers from this benchmark's runs (run names start with 'hbench-'), if any survived."""
    try:
        out = subprocess.run(["docker", "ps", "-a", "--filter", "label=hermes-batch.run",
                              "--format", '{{.ID}} {{.Label "hermes-batch.run"}}'], capture_output=True, text=True,
                             timeout=60)
        ids = [line.split()[0] for line in out.stdout.splitlines()
               if len(line.split()) == 2 and line.split()[1].startswith("hbench-")]
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        log("could not remove this benchmark's leftover containers: the Docker engine does not answer")
        return 0
    return len(ids)


# --------------------------------------------------------------------------- workloads

def workload_specs(a: argparse.Namespace) -> dict[int, dict[str, Any]]:
    return {
        1: dict(title="Framework overhead, no containers", n=a.w1_prompts, workers=a.w1_workers, latency=0.0,
                turns=3, docker=False),
        2: dict(title="Overhead with Docker (a container per prompt for us)", n=a.w2_prompts, workers=a.w1_workers,
                latency=0.0, turns=3, docker=True, limit_count=a.limit_count),
        3: dict(title="Latency-bound with Docker", n=a.w3_prompts, workers=a.w3_workers, latency=a.w3_latency,
                turns=4, docker=True, limit_count=max(a.limit_count, 2 * a.w3_workers)),
        4: dict(title="Latency-bound, no containers", n=a.w4_prompts, workers=a.w4_workers, latency=a.w4_latency,
                turns=3, docker=False),
    }


def run_agent_workload(num: int, spec: dict[str, Any], systems: Systems, repeats: int, skip_ref: bool,
                       timeout: float, server_variant: bool, direct_variant: bool) -> dict[str, Any]:
    log(f"workload {num}: {spec['title']}: {spec['n']} prompts, {spec['workers']} workers, "
        f"{spec['turns']} calls of {spec['latency']}s, docker={spec['docker']}, {repeats} repeat(s)")
    out: dict[str, Any] = {"spec": spec, "reference": [], "ours": [], "ours-server": [], "ours-direct": [], "limit": [],
                           "other_load_before": other_load_sample()}
    for r in range(repeats):
        if spec["docker"]:
            out["limit"].append(systems.sandbox_limit(spec["workers"], spec["limit_count"]))
        kw = dict(n=spec["n"], workers=spec["workers"], latency=spec["latency"], turns=spec["turns"],
                  docker=spec["docker"], tag=f"w{num}r{r}", timeout=timeout)
        if not skip_ref:
            out["reference"].append(systems.run("reference", **kw))
        out["ours"].append(systems.run("ours", **kw))
        if server_variant:
            out["ours-server"].append(systems.run("ours-server", **kw))
        if direct_variant:
            out["ours-direct"].append(systems.run("ours-direct", **kw))
        if spec["docker"] and r == repeats - 1:
            # the limit moves with others' load: bracket the runs, measure once more at the end
            out["limit"].append(systems.sandbox_limit(spec["workers"], spec["limit_count"]))
    return out


def measured_script(cmd: list[str], where: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> dict:
    """Run a bench script that prints one JSON object; add its process tree's peak PSS, wall and CPU."""
    m = run_measured(cmd, env=env or {**os.environ, "PYTHONPATH": str(REPO)}, cwd=cwd or REPO,
                     log_path=where, timeout=7200)
    text = Path(where).read_text()
    if m.rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (rc {m.rc}): {text[-2000:]}")
    res = json.loads(text.strip().splitlines()[-1])
    res.update(peak_pss_mib=m.peak_pss_mib, process_wall=m.wall, process_cpu=m.cpu, command=" ".join(cmd))
    return res


def run_data_workload(a: argparse.Namespace, scratch: Path, ref_python: Path | None, repeats: int,
                      src: Path = REPO) -> dict[str, Any]:
    n, rows = a.w5_trajectories, a.w5_resume_rows
    log(f"workload 5: merge of {n} trajectories (and {n // 10}); resume planning at {rows} rows; {repeats} repeat(s)")
    py = [sys.executable, "-m", "bench.datascale"]
    ours_env = {**os.environ, "PYTHONPATH": str(REPO), "HERMES_BENCH_SRC": str(src)}
    ref_env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "TERMINAL_"))}
    ref_env.update(HOME=str(scratch / "reference-home"), HERMES_HOME=str(scratch / "reference-hermes-home"))
    ref_script = str(BENCH / "reference_datascale.py")
    logs = scratch / "logs"
    out: dict[str, Any] = {"n": n, "rows": rows, "merge": {}, "merge_small": {}, "plan": {}, "gen": {}}
    big, small = scratch / "merge" / f"run-{n}", scratch / "merge" / f"run-{n // 10}"
    t = time.time()
    out["gen"]["merge"] = json.loads(subprocess.run(py + ["gen-merge", str(big), "--n", str(n)], cwd=REPO,
                                                    env=ours_env, capture_output=True, text=True, check=True).stdout)
    subprocess.run(py + ["gen-merge", str(small), "--n", str(max(1, n // 10))], cwd=REPO, check=True,
                   env=ours_env, capture_output=True)
    log(f"  generated merge input: {out['gen']['merge']['bytes'] / 1e6:.0f} MB in {time.time() - t:.0f}s")
    out["merge"] = {"ours": [], "reference": []}
    for r in range(repeats):
        if ref_python:
            out["merge"]["reference"].append(measured_script([str(ref_python), ref_script, "merge", str(big)],
                                                             logs / f"ref-merge-{r}.log", env=ref_env))
        out["merge"]["ours"].append(measured_script(py + ["merge", str(big)], logs / f"our-merge-{r}.log", env=ours_env))
        log(f"  merge {n}: ours {out['merge']['ours'][-1]['mb_per_s']:.0f} MB/s, peak "
            f"{out['merge']['ours'][-1]['peak_pss_mib']:.0f} MiB" + (
                f"; reference {out['merge']['reference'][-1]['mb_per_s']:.0f} MB/s" if ref_python else ""))
    out["merge_small"]["ours"] = measured_script(py + ["merge", str(small)], logs / "our-merge-small.log", env=ours_env)
    if ref_python:
        out["merge_small"]["reference"] = measured_script([str(ref_python), ref_script, "merge", str(small)],
                                                          logs / "ref-merge-small.log", env=ref_env)
    shutil.rmtree(scratch / "merge", ignore_errors=True)

    for case, done in (("all_done", rows), ("99pct_done", rows - rows // 100)):
        root = scratch / "resume" / case
        t = time.time()
        out["gen"][case] = json.loads(subprocess.run(
            py + ["gen-resume", str(root), "--rows", str(rows), "--done", str(done)], cwd=REPO,
            env=ours_env, capture_output=True, text=True, check=True).stdout)
        log(f"  generated resume case {case}: {rows} rows, {done} done, journal "
            f"{out['gen'][case]['journal_bytes'] / 1e6:.0f} MB in {time.time() - t:.0f}s")
        res = {"ours_cold": [], "ours_warm": [], "reference": []}
        for r in range(repeats):
            res["ours_cold"].append(measured_script(py + ["plan", str(root), "--cold"], logs / f"plan-{case}-cold-{r}.log", env=ours_env))
            if ref_python:
                res["reference"].append(measured_script([str(ref_python), ref_script, "plan", str(root), "resume"],
                                                        logs / f"plan-{case}-ref-{r}.log", env=ref_env, cwd=root))
            res["ours_warm"].append(measured_script(py + ["plan", str(root)], logs / f"plan-{case}-warm-{r}.log", env=ours_env))
            log(f"  plan {case}: ours cold {res['ours_cold'][-1]['plan_total']:.1f}s, warm "
                f"{res['ours_warm'][-1]['plan_total']:.1f}s" + (
                    f"; reference {res['reference'][-1]['plan_total']:.1f}s" if ref_python else ""))
        out["plan"][case] = res
        shutil.rmtree(root, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- main

FULL = dict(w1_prompts=200, w1_workers=4, w2_prompts=200, w3_prompts=384, w3_workers=64, w3_latency=4.0,
            w4_prompts=640, w4_workers=64, w4_latency=1.0, w5_trajectories=100_000, w5_resume_rows=1_000_000,
            limit_count=60, w6_prompts=200, w6_workers=64, w6_latency=0.5, w6_rpm=600.0, w6_error_rate=0.02)
QUICK = dict(w1_prompts=20, w1_workers=4, w2_prompts=12, w3_prompts=32, w3_workers=16, w3_latency=1.0,
             w4_prompts=64, w4_workers=16, w4_latency=0.5, w5_trajectories=5_000, w5_resume_rows=20_000,
             limit_count=16, w6_prompts=40, w6_workers=64, w6_latency=0.5, w6_rpm=600.0, w6_error_rate=0.02)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="1,2,3,4,5,6", help="comma list of workloads to run (1-6)")
    p.add_argument("--quick", action="store_true", help="small sizes and 1 repeat: a smoke check")
    p.add_argument("--repeats", type=int, default=None, help="repeats per workload (default 3; 1 with --quick)")
    p.add_argument("--repeats-for", default="", metavar="W=N,...", help="per-workload repeats, e.g. 3=1,4=1")
    for k, v in FULL.items():
        p.add_argument("--" + k.replace("_", "-"), type=type(v), default=None,
                       help=f"default {v} ({QUICK[k]} with --quick)")
    p.add_argument("--server-variant", default="1,2,3,4", metavar="W,...",
                   help="workloads that also run ours against a standing `prefect server start` ('' for none)")
    p.add_argument("--direct-variant", default="1,2,3,4,6", metavar="W,...",
                   help="workloads that also run ours with --engine direct (no Prefect) ('' for none)")
    p.add_argument("--ours-src", choices=("head", "live"), default="head",
                   help="measure ours from `git archive HEAD` (default: immune to edits during the run) or the live work tree")
    p.add_argument("--ours-ref", default="HEAD", metavar="COMMIT",
                   help="with --ours-src head: the commit of ours to measure (default HEAD)")
    p.add_argument("--skip-reference", action="store_true", help="run ours only (debugging the bench)")
    p.add_argument("--scratch", default=None, help="scratch folder (default: a new one under /tmp, removed after)")
    p.add_argument("--keep-scratch", action="store_true")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per system run")
    p.add_argument("--output", default=str(BENCH / "REPORT.md"))
    p.add_argument("--results", default=str(BENCH / "results.json"))
    a = p.parse_args(argv)
    base = QUICK if a.quick else FULL
    for k, v in base.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.repeats is None:
        a.repeats = 1 if a.quick else 3
    return a


def _on_sigterm(*_: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


def main(argv: list[str] | None = None) -> int:
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)  # so the finally blocks below clean up
    a = parse_args(argv)
    started = time.time()
    _facts()
    wanted = [int(x) for x in a.workloads.split(",") if x.strip()]
    per = {int(k): int(v) for k, v in (x.split("=") for x in a.repeats_for.split(",") if x.strip())}
    scratch = Path(a.scratch) if a.scratch else Path(tempfile.mkdtemp(prefix="hermes-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    log(f"scratch folder {scratch}")
    src = product_source(scratch, a.ours_src, a.ours_ref)
    log(f"measuring ours at {src['commit'][:10]} ({src['mode']}: {src['path']})"
        + (f"; product files modified in the work tree, not measured: {src['dirty_at_start']}" if src["dirty_at_start"] and src["mode"] == "head" else ""))
    ref_python = None if a.skip_reference else ensure_reference()
    if any(w in wanted for w in (2, 3)):
        ensure_images()
    server_for = {int(x) for x in a.server_variant.split(",") if x.strip()}
    direct_for = {int(x) for x in a.direct_variant.split(",") if x.strip()}
    server = None
    results: dict[str, Any] = {"workloads": {}, "source": src}
    other_load: dict[str, float] = {}
    try:
        if server_for & set(wanted) & {1, 2, 3, 4}:
            log("starting a standing Prefect server for the 'ours-server' variant")
            server = PrefectServer(scratch / "prefect-server-home", scratch / "prefect-server.log")
            server.start()
        systems = Systems(scratch, ref_python, server, Path(src["path"]))
        if any(w in wanted for w in (1, 2, 3, 4, 6)):
            log("warm-up: one small run of each system (the reference pip-installs a speech package on first run; "
                "ours creates its Prefect database)")
            results["warmup"] = [
                systems.run(system, n=4, workers=2, latency=0.0, turns=3, docker=False, tag="warmup", timeout=600)
                for system in (["reference"] if ref_python else []) + ["ours"] + (["ours-server"] if server else [])
                + (["ours-direct"] if direct_for & set(wanted) else [])]
        specs = workload_specs(a)
        for num in wanted:
            repeats = per.get(num, a.repeats)
            if num in specs:
                w = run_agent_workload(num, specs[num], systems, repeats, ref_python is None, a.timeout,
                                       server is not None and num in server_for, num in direct_for)
                other_load[str(num)] = w["other_load_before"]
                results["workloads"][str(num)] = w
            elif num == 6:
                from bench import ratelimited
                w = ratelimited.run_workload(ratelimited.spec(a), systems, repeats, a.timeout, num in direct_for)
                other_load["6"] = w["other_load_before"]
                results["workloads"]["6"] = w
            elif num == 5:
                other_load["5"] = other_load_sample()
                results["workloads"]["5"] = run_data_workload(a, scratch, ref_python, repeats, Path(src["path"]))
            # write as we go: a crash late in the run keeps what was measured
            _save(a, results, started, other_load, wanted, per, argv)
    finally:
        if server:
            server.stop()
        from flows.local_server import stop as stop_background_server

        stop_background_server(scratch / "prefect-home")  # the default path's server ("ours"), if started
        if any(w in wanted for w in (2, 3)):
            remove_containers(REFERENCE_LABEL)
            remove_containers("hermes-bench")
            remove_our_bench_containers()
        if not a.keep_scratch and not a.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    _save(a, results, started, other_load, wanted, per, argv)
    log(f"wrote {a.output} and {a.results} in {(time.time() - started) / 60:.1f} min")
    return 0


_FACTS: dict[str, Any] = {}


def _facts() -> dict[str, Any]:
    if not _FACTS:
        _FACTS.update(machine_facts())
    return _FACTS


def _save(a: argparse.Namespace, results: dict, started: float, other_load: dict, wanted: list[int],
          per: dict[int, int], argv: list[str] | None) -> None:
    from bench.report import render

    def reps(n: int) -> str:
        return str(per.get(n, a.repeats))

    sizes = [
        ["1", f"{a.w1_prompts} prompts, {a.w1_workers} workers, 3 calls, 0 s", "200 prompts, 4 workers, 3 calls, 0 s", reps(1)],
        ["2", f"{a.w2_prompts} prompts, {a.w1_workers} workers, 3 calls, 0 s, Docker", "200, 4 workers, Docker", reps(2)],
        ["3", f"{a.w3_prompts} prompts, {a.w3_workers} workers, 4 calls × {a.w3_latency} s, Docker",
         "384 prompts, 64 workers, 4 calls × 4 s, Docker", reps(3)],
        ["4", f"{a.w4_prompts} prompts, {a.w4_workers} workers, 3 calls × {a.w4_latency} s",
         "640 prompts, 64 workers, 3 calls × 1 s", reps(4)],
        ["5", f"merge {a.w5_trajectories:,} trajectories; resume planning at {a.w5_resume_rows:,} rows",
         "100,000 trajectories; 1,000,000 rows", reps(5)],
        ["6", f"{a.w6_prompts} prompts, {a.w6_workers} workers, 3 calls × {a.w6_latency} s, cap {a.w6_rpm:g}/min, "
              f"{a.w6_error_rate:.0%} 500s", "64 workers, cap R", reps(6)],
    ]
    sizes = [s for s in sizes if int(s[0]) in wanted]
    reduced = [s[0] for s in sizes if any(
        getattr(a, k) != FULL[k] for k in FULL if k.startswith(f"w{s[0]}_") or (s[0] == "2" and k in ("w2_prompts", "w1_workers")))]
    results["meta"] = {
        "command": "python -m bench" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"), "mode": "quick" if a.quick else "full",
        "elapsed_min": (time.time() - started) / 60, "machine": _facts(), "other_load": other_load,
        "sizes": sizes, "reduced": (f"workload(s) {', '.join(reduced)} ran below the issue's sizes" if reduced else ""),
        "reference": f"hermes-agent=={REFERENCE_VERSION}",
    }
    Path(a.results).write_text(json.dumps(results, indent=1, default=str))
    try:
        Path(a.output).write_text(render(results))
    except Exception as e:  # noqa: BLE001 - results.json is kept; `python -m bench.report` re-renders
        log(f"could not render the report: {type(e).__name__}: {e}")


if __name__ == "__main__":
    sys.exit(main())
