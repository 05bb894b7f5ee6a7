"""Which of the sandbox limits runc would apply on this host, asked before a run starts.

The cgroup controllers the limits need (memory with swap accounting, cpu quota, pids; cgroup
v1, v2 or a hybrid of both), the engine's seccomp section (rootfs.docker_seccomp), then a probe:
one sandbox opened with the run's settings, whose cgroup is read back from the host.
"""
from __future__ import annotations

import logging
from pathlib import Path

from docker.utils import parse_bytes

from hermes.sandbox import lifecycle
from hermes.sandbox.base import SandboxError, SandboxSettings, SandboxSpec, WeakerSandbox
from hermes.sandbox.runc import state
from hermes.sandbox.runc.rootfs import docker_seccomp

log = logging.getLogger(__name__)

_seccomp_problem: list[str] = []


def seccomp_or_none(settings: SandboxSettings) -> dict | None:
    """The seccomp section every sandbox gets; None only when it cannot be had and the run accepted that."""
    try:
        return docker_seccomp()
    except Exception as e:  # noqa: BLE001 - any failure means no profile
        if settings.allow_weaker_sandbox:
            return None
        raise WeakerSandbox(f"seccomp: the Docker engine's default profile could not be had ({e})") from e


def controller_problems() -> list[str]:
    fs = state.CGROUP_FS
    if (fs / "cgroup.controllers").exists():  # cgroup v2 alone
        have = set((fs / "cgroup.controllers").read_text().split())
        missing = [c for c in ("memory", "cpu", "pids") if c not in have]
        return [f"cgroup v2 has no {c} controller: its limit would not apply" for c in missing]
    needs = {"memory": ("memory.limit_in_bytes", "memory limit"),
             "cpu": ("cpu.cfs_quota_us", "CPU limit"), "pids": ("pids.max", "pids limit")}
    problems = []
    for controller, (knob, what) in needs.items():
        if not (fs / controller).is_dir():
            problems.append(f"no cgroup v1 {controller} controller mounted: the {what} would not apply")
    if (fs / "memory").is_dir() and not (fs / "memory" / "memory.memsw.limit_in_bytes").exists():
        problems.append("no swap accounting (memory.memsw): memory beyond the limit could go to swap")
    return problems


def limit_problems(settings: SandboxSettings) -> list[str]:
    problems = controller_problems()
    try:
        docker_seccomp()
    except Exception as e:  # noqa: BLE001
        problems.append(f"seccomp: the Docker engine's default profile could not be had ({e})")
    for p in _probe(settings, seccomp_ok=not problems or not any(p.startswith("seccomp") for p in problems)):
        if p not in problems:
            problems.append(p)
    return problems


def _probe(settings: SandboxSettings, seccomp_ok: bool) -> list[str]:
    """Open one sandbox as the run would and read its limits back from the host."""
    from hermes.sandbox.runc.sandbox import RuncSandbox

    spec = SandboxSpec(image=settings.image, run_id=lifecycle.PROBE_RUN, prompt_id="probe", lifetime=60.0)
    try:
        sb = RuncSandbox(spec, settings, docker_seccomp() if seccomp_ok else None)
    except SandboxError as e:
        log.warning("runc sandbox limits not probed: %s", e)
        return []
    try:
        return applied_problems(state.cgroup_dirs(sb.name), settings)
    finally:
        sb.close()


def applied_problems(dirs: list[Path], s: SandboxSettings) -> list[str]:
    want = {"memory.limit_in_bytes": parse_bytes(s.memory), "memory.memsw.limit_in_bytes": parse_bytes(s.memory),
            "memory.max": parse_bytes(s.memory), "pids.max": s.pids_limit,
            "cpu.cfs_quota_us": max(1000, int(s.cpus * 100_000))}
    seen = {}
    for d in dirs:
        for knob in want:
            try:
                seen[knob] = (d / knob).read_text().split()[0]
            except OSError:
                continue
    if "cpu.max" not in seen:
        for d in dirs:
            try:
                seen["cpu.cfs_quota_us"] = (d / "cpu.max").read_text().split()[0]
            except OSError:
                continue
    problems = []
    for knob, value in want.items():
        if knob in seen and seen[knob] != str(value):
            problems.append(f"{knob} is {seen[knob]}, not {value}: that limit does not hold")
    for knob, what in (("pids.max", "pids"), ("cpu.cfs_quota_us", "CPU")):
        if knob not in seen:
            problems.append(f"the sandbox's cgroup has no {knob}: the {what} limit does not hold")
    if "memory.limit_in_bytes" not in seen and "memory.max" not in seen:
        problems.append("the sandbox's cgroup has no memory limit: the memory limit does not hold")
    return problems
