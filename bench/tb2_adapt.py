"""Published Terminal-Bench 2.0 tasks, adapted to build offline, then their oracles run two ways:
`hermes-batch verify` and a plain `docker run --network none --cap-drop ALL` + `docker exec` loop
(as Harbor's docker environment execs into its container), the reference.

Nothing fetched is committed: the tasks are copied at run time out of a fetched mirror (a git
directory holding `terminal-bench-2/<task>/`, e.g. github:yujianll/skill-usage) into --out, and
adapted there, the rest byte for byte:
  environment/Dockerfile  its first FROM becomes the local default image (hermes-sandbox:bookworm),
                          then `USER root` and `ENV HOME=/root` (as the published python/ubuntu
                          images have them), then one RUN installing from Debian what the tests
                          installed at run time (pytest, ...); Debian's mirror answers inside
                          `docker build`, PyPI does not
  tests/test.sh           its run-time installs dropped (apt-get update, apt-get install -y PKGS
                          (PKGS then installed at build time), uv's installer, pip install);
                          `uvx -p .. -w .. pytest ARGS` and `python -m pytest ARGS` become `python3 -m pytest ARGS` without --ctrf
                          (pytest-json-ctrf has no Debian package)
A task whose Dockerfile or test.sh needs what cannot be had offline (pip installs in the image, a
git clone, a test package with no Debian equivalent) is refused with why.

    python -m bench.tb2_adapt adapt --mirror /work/.mirror/yujianll+skill-usage/repo --out /tmp/tb2/tasks
    python -m bench.tb2_adapt run --tasks /tmp/tb2/tasks --output /tmp/tb2/results.json
"""
from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

BASE = "hermes-sandbox:bookworm"
PREFIX = "terminal-bench-2"
TASKS = ["cancel-async-tasks", "circuit-fibsqrt", "constraints-scheduling", "db-wal-recovery", "git-leak-recovery",
         "large-scale-text-editing", "log-summary-date-ranges", "password-recovery", "polyglot-c-py",
         "prove-plus-comm", "regex-log", "schemelike-metacircular-eval", "sqlite-db-truncate", "vulnerable-secret"]
#: tried first, and why they are not among the fourteen (bench/TASKS_REPORT.md)
NOT_OFFLINE = {"fix-git": "environment/setup.sh clones from github.com at build time",
               "sanitize-git-repo": "environment/setup.sh clones from github.com at build time",
               "extract-elf": "its build (nodejs, npm: some 400 Debian packages) ran past its build_timeout_sec "
                              "600 on the shared 2-core machine"}
#: PyPI names the tests install -> Debian packages (None: not needed offline)
DEBIAN = {"pytest": "python3-pytest", "pytest-json-ctrf": None, "gitpython": "python3-git",
          "requests": "python3-requests", "numpy": "python3-numpy"}
_DROP = [re.compile(p) for p in (r"^\s*apt-get update\s*$",
                                 r"^\s*curl -LsSf https://astral\.sh/uv/.*\|\s*sh\s*$",
                                 r"^\s*source \$HOME/\.local/bin/env\s*$")]
_UVX = re.compile(r"uvx\s*\\\n((?:\s*-[pw]\s+\S+\s*\\\n)*)\s*pytest\b([^\n]*)")
_PY_PYTEST = re.compile(r"^(\s*)python3? -m pytest\b([^\n]*)$", re.M)
_PIP = re.compile(r"^\s*pip3? install ([^\n]*)$", re.M)
_APT = re.compile(r"^\s*apt-get install -y ([^\n]*)$", re.M)


class Unadaptable(ValueError):
    pass


def _pkg(spec: str) -> str:
    return re.split(r"[=<>\[]", spec, maxsplit=1)[0].lower()


def _debian(names: list[str], task: str) -> list[str]:
    out = []
    for name in names:
        if name not in DEBIAN:
            raise Unadaptable(f"{task}: its tests install {name!r}, which has no Debian package here")
        if DEBIAN[name]:
            out.append(DEBIAN[name])
    return out


def adapt_test(text: str, task: str) -> tuple[str, list[str]]:
    """(test.sh without its run-time installs, the Debian packages they become)."""
    wanted: list[str] = []

    def uvx(m: re.Match) -> str:
        wanted.extend(_pkg(w) for w in re.findall(r"-w\s+(\S+)", m.group(1)))
        return "python3 -m pytest" + m.group(2).replace(" --ctrf /logs/verifier/ctrf.json", "")

    text = _UVX.sub(uvx, text)
    text = _PY_PYTEST.sub(lambda m: m.group(1) + "python3 -m pytest"
                          + m.group(2).replace(" --ctrf /logs/verifier/ctrf.json", ""), text)
    for m in _PIP.finditer(text):
        wanted.extend(_pkg(w) for w in m.group(1).split() if not w.startswith("-"))
    text = _PIP.sub("", text)
    apt = [w for m in _APT.finditer(text) for w in m.group(1).split() if not w.startswith("-")]
    text = _APT.sub("", text)
    lines = [line for line in text.split("\n") if not any(p.search(line) for p in _DROP)]
    text = "\n".join(lines)
    left = [line for line in lines if re.search(r"\b(uvx?|pip3?|apt-get|apt|curl|wget)\b", line)
            and not line.lstrip().startswith("#")]
    if left:
        raise Unadaptable(f"{task}: test.sh still installs at run time: {left}")
    return text, _debian(sorted(set(wanted)), task) + sorted(set(apt))


def check_environment(folder: Path, task: str) -> None:
    """Refuse a build context whose files fetch from outside Debian's mirror (a setup script's git clone)."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.stat().st_size < 1 << 20):
        text = path.read_text(errors="replace")
        if re.search(r"git clone|\b(pip3?|uv) install\b|curl |wget |npm install", text):
            raise Unadaptable(f"{task}: {path.relative_to(folder.parent)} fetches from outside Debian's mirror")


def adapt_dockerfile(text: str, packages: list[str], task: str) -> str:
    if len(re.findall(r"^\s*FROM\s", text, re.M | re.I)) != 1:
        raise Unadaptable(f"{task}: its Dockerfile has more than one stage")
    if re.search(r"\b(pip3?|uv) install\b|git clone|curl |wget ", text):
        raise Unadaptable(f"{task}: its Dockerfile fetches from outside Debian's mirror (pip, git clone, curl)")
    install = " ".join(["python3-pytest", "python-is-python3", *[p for p in packages if p != "python3-pytest"]])
    head = (f"FROM {BASE}\nUSER root\nENV HOME=/root\n"
            f"RUN apt-get update && apt-get install -y --no-install-recommends {install} "
            "&& rm -rf /var/lib/apt/lists/*\n")
    return re.sub(r"^\s*FROM\s+\S+[^\n]*\n?", lambda m: head, text, count=1, flags=re.M | re.I)


def adapt(mirror: Path, out: Path, tasks: list[str]) -> dict[str, str]:
    """Copy each task out of the mirror's HEAD into `out` and adapt it; {task: why not} for refused ones."""
    refused = {}
    out.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        data = subprocess.run(["git", "-C", str(mirror), "archive", "HEAD", f"{PREFIX}/{task}"],
                              capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(out, filter="data")
        folder = out / PREFIX / task
        target = out / task
        if target.exists():
            subprocess.run(["rm", "-rf", str(target)], check=True)
        folder.rename(target)
        try:
            check_environment(target / "environment", task)
            test, packages = adapt_test((target / "tests" / "test.sh").read_text(), task)
            docker = adapt_dockerfile((target / "environment" / "Dockerfile").read_text(), packages, task)
        except Unadaptable as e:
            refused[task] = str(e)
            subprocess.run(["rm", "-rf", str(target)], check=True)
            continue
        (target / "tests" / "test.sh").write_text(test)
        (target / "environment" / "Dockerfile").write_text(docker)
    subprocess.run(["rm", "-rf", str(out / PREFIX)], check=True)
    return refused


# -- running the oracles -------------------------------------------------------------------------

def _sh(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


def plain_docker(folder: Path, image: str, timeout: float = 900, cap_drop_all: bool = True) -> dict:
    """The reference: the image as built, `docker run --network none --cap-drop ALL`, solve.sh then
    test.sh by `docker exec` (their working directory the image's WORKDIR), the reward read back."""
    name = f"tb2-ref-{folder.name}-{int(time.time())}"
    started = time.monotonic()
    caps = ["--cap-drop", "ALL"] if cap_drop_all else []  # without: Docker's default set, as under Harbor
    run = _sh("docker", "run", "-d", "--name", name, "--network", "none", *caps,
              "--entrypoint", "sleep", image, "infinity")
    if run.returncode:
        return {"passed": False, "reason": f"docker run failed: {run.stderr.strip()}"}
    try:
        _sh("docker", "exec", name, "mkdir", "-p", "/logs/verifier", "/logs/agent")
        _sh("docker", "cp", str(folder / "solution"), f"{name}:/solution")
        solve = _sh("docker", "exec", name, "bash", "/solution/solve.sh", timeout=timeout)
        _sh("docker", "cp", str(folder / "tests"), f"{name}:/tests")
        test = _sh("docker", "exec", name, "bash", "/tests/test.sh", timeout=timeout)
        reward = _sh("docker", "exec", name, "cat", "/logs/verifier/reward.txt").stdout.strip()
    finally:
        _sh("docker", "rm", "-f", name)
    value = float(reward) if re.fullmatch(r"[0-9.]+", reward or "") else None
    return {"passed": value is not None and value >= 1, "reward": value,
            "seconds": round(time.monotonic() - started, 1),
            "solve_exit": solve.returncode, "solve_tail": (solve.stdout + solve.stderr)[-2000:],
            "test_exit": test.returncode, "test_tail": (test.stdout + test.stderr)[-3000:]}


def run(tasks: Path, output: Path, backend: str, workers: int, cap_drop_all: bool = True,
        skip_verify: bool = False, skip_reference: bool = False, run_name: str | None = None) -> dict:
    from hermes.sandbox.docker import build

    folders = sorted(p for p in tasks.iterdir() if p.is_dir())
    started = time.monotonic()
    cmd = [sys.executable, "-m", "flows.cli", "verify", str(tasks), "--json", "--num_workers", str(workers),
           "--sandbox_backend", backend, "--run_name", run_name or f"tb2-{backend}"]
    if skip_verify:
        verified = {"results": [], "problems": []}
    else:
        got = _sh(*cmd, timeout=7200)
        try:
            verified = json.loads(got.stdout)
        except ValueError:
            raise SystemExit(f"verify printed no JSON (exit {got.returncode}):\n{got.stdout[-2000:]}\n"
                             f"{got.stderr[-4000:]}")
    verify_seconds = time.monotonic() - started
    by = {r["task"]: r for r in verified["results"]}
    results = {"verify_seconds": round(verify_seconds, 1), "limits": verified.get("limits"),
               "problems": verified["problems"], "tasks": {}}
    for folder in folders:
        image = build.image_tag(folder / "environment", folder.name)
        if skip_reference:
            ref = {"passed": None, "reason": "not run (--skip_reference)"}
        elif _sh("docker", "image", "inspect", image).returncode:
            ref = {"passed": False, "reason": f"no image {image} (its build failed under verify)"}
        else:
            ref = plain_docker(folder, image, cap_drop_all=cap_drop_all)
        results["tasks"][folder.name] = {"verify": by.get(folder.name), "plain_docker": ref}
        print(f"{folder.name:32} verify {'pass' if (by.get(folder.name) or {}).get('passed') else 'FAIL'}  "
              f"plain docker {'pass' if ref['passed'] else 'FAIL'}", flush=True)
    output.write_text(json.dumps(results, indent=1))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    a = sub.add_parser("adapt")
    a.add_argument("--mirror", type=Path, required=True)
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--task", action="append", help="a task to adapt (repeatable; default: the fourteen)")
    r = sub.add_parser("run")
    r.add_argument("--tasks", type=Path, required=True)
    r.add_argument("--output", type=Path, required=True)
    r.add_argument("--backend", default="docker")
    r.add_argument("--num_workers", type=int, default=2)
    r.add_argument("--default_caps", action="store_true", help="the reference keeps Docker's default capabilities "
                   "(as Harbor's containers do) instead of --cap-drop ALL")
    r.add_argument("--skip_verify", action="store_true", help="only the plain docker reference")
    r.add_argument("--skip_reference", action="store_true", help="only hermes-batch verify")
    r.add_argument("--run_name", default=None, help="labels verify's sandboxes (default tb2-BACKEND)")
    args = p.parse_args(argv)
    if args.action == "adapt":
        refused = adapt(args.mirror, args.out, args.task or TASKS)
        for task, why in refused.items():
            print(f"refused {why}")
        print(f"adapted {len((args.task or TASKS)) - len(refused)} task(s) into {args.out}")
        return 0
    run(args.tasks, args.output, args.backend, args.num_workers, cap_drop_all=not args.default_caps,
        skip_verify=args.skip_verify, skip_reference=args.skip_reference, run_name=args.run_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
