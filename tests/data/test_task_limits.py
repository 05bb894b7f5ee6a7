"""A task folder's sandbox gets what its task.toml asks (hermes.run.task_limits): real task folders
built here, run by `hermes-batch verify` on the Docker engine, each task's own tests reading the
limits its container really has from its cgroup."""
from __future__ import annotations

import json

from flows.task_commands import verify_main
from hermes.data.harbor import read_tasks
from hermes.run.task_limits import summary, task_limits
from hermes.sandbox.base import DEFAULT_IMAGE
from hermes.sandbox.registry import Capacity
from hermes.settings import RunSettings
from tests.conftest import containers_of
from tests.data.test_harbor_tasks import task
from tests.helpers import unique_run

RUN = unique_run("limits")

# The container's own memory and CPU limits, from its cgroup (v1 or v2), as the task sees them.
PROBE = r"""python3 - <<'EOF'
import pathlib, sys
def first(*paths):
    for p in paths:
        p = pathlib.Path(p)
        if p.exists():
            return p.read_text().split()
    return None
v2 = first("/sys/fs/cgroup/cpu.max")
if v2:
    quota, period = v2
else:
    quota, = first("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us")
    period, = first("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us")
mem, = first("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
cpus = int(quota) / int(period)
mb = int(mem) >> 20
print(f"cpus={cpus:g} memory_mb={mb}")
want_cpus, want_mb = float(sys.argv[1]), int(sys.argv[2])
open("/logs/verifier/reward.txt", "w").write("1" if (cpus, mb) == (want_cpus, want_mb) else "0")
EOF
"""


def toml(cpus: float, memory_mb: int, verifier: float = 900.0, agent: float = 900.0) -> str:
    return (f'version = "1.0"\n[verifier]\ntimeout_sec = {verifier}\n[agent]\ntimeout_sec = {agent}\n'
            f"[environment]\ncpus = {cpus}\nmemory_mb = {memory_mb}\nstorage_mb = 10240\n")


def probe(want_cpus: float, want_mb: int) -> str:
    return PROBE.replace("- <<'EOF'", f"- {want_cpus:g} {want_mb} <<'EOF'", 1)


def test_a_task_gets_the_memory_and_cpus_it_asks_and_no_more_than_the_engine_has(tmp_path, default_image,
                                                                              docker_engine, capsys):
    ncpu = docker_engine.info()["NCPU"]
    root = tmp_path / "tasks"
    # 1536 MB is more than the run's default memory (1g): the task gets it all, as under Harbor
    task(root, "asks-more", "x", probe(1.5 if ncpu >= 2 else 1, 1536), toml=toml(1.5 if ncpu >= 2 else 1, 1536))
    # more CPUs than the engine has: Docker would refuse the container; it gets the engine's all
    task(root, "asks-too-many", "x", probe(ncpu, 700), toml=toml(ncpu + 62, 700))
    code = verify_main([str(root), "--json", "--sandbox_image", DEFAULT_IMAGE, "--run_name", RUN])
    got = json.loads(capsys.readouterr().out)
    by = {r["task"]: r for r in got["results"]}
    assert code == 0, json.dumps(got, indent=1)
    assert all(r["passed"] for r in by.values())
    assert f"the engine has {ncpu:g} CPUs" in got["limits"] and "cpus of 1 task(s)" in got["limits"]
    assert "memory 1 ask 700 MB, 1 ask 1536 MB" in got["limits"]
    assert "2 ask storage (up to 10240 MB): not enforced" in got["limits"]
    assert containers_of(docker_engine, f"verify-{RUN}") == []


def test_the_users_ceilings_and_the_machines_are_the_only_ones(tmp_path):
    root = tmp_path / "tasks"
    task(root, "big", "x", "true\n", toml=toml(2, 4096, verifier=900, agent=1200))
    task(root, "small", "x", "true\n", toml=toml(1, 512, verifier=60, agent=120))
    (root / "plain").mkdir()
    task(root, "plain", "x", "true\n", toml='version = "1.0"\n')
    folders = {t.name: t.row().task_folder for t in read_tasks(root).tasks}
    roomy = Capacity(cpus=64, memory_mb=64 << 10, where="engine")

    # no ceiling set: each task as asked, past the run's defaults (1 CPU, 1g, 300 s check, 3600 s prompt)
    s = RunSettings(dataset_file=str(root), batch_size=1, run_name="x")
    big = task_limits(folders["big"], s, roomy)
    assert (big.cpus, big.memory_mb, big.agent_timeout, big.verifier_timeout) == (2, 4096, 1200, 900)
    assert big.lifetime == 1200 + 900 + s.setup_timeout and big.capped == ()
    assert big.profile.memory == "4096m"
    small = task_limits(folders["small"], s, roomy)
    assert (small.cpus, small.memory_mb, small.verifier_timeout) == (1, 512, 60)
    # a task.toml that says nothing: the run's flags
    plain = task_limits(folders["plain"], s, roomy)
    assert (plain.cpus, plain.memory_mb, plain.verifier_timeout, plain.lifetime) == (1, 1024, 300, 3600)
    line = summary(list(folders.values()), s, roomy)
    assert line.startswith("3 task(s): memory 1 ask 512 MB, 1 ask 4 GB, 1 give none (the run's 1g); ")
    assert "agent time up to 1200 s; verifier time up to 900 s" in line and line.endswith("each gets what it asks")

    # the user's ceilings
    capped = RunSettings(dataset_file=str(root), batch_size=1, run_name="x", task_max_memory="2g",
                         task_max_cpus=1, task_max_timeout=600)
    big = task_limits(folders["big"], capped, roomy)
    assert (big.cpus, big.memory_mb, big.agent_timeout, big.verifier_timeout) == (1, 2048, 600, 600)
    assert task_limits(folders["small"], capped, roomy).capped == ()
    line = summary(list(folders.values()), capped, roomy)
    assert "capped: agent time of 1 task(s) (--task_max_timeout 600), cpus of 1 task(s) (--task_max_cpus 1)" in line
    assert "memory of 1 task(s) (--task_max_memory 2g)" in line

    # the machine's: a small engine
    tiny = Capacity(cpus=1, memory_mb=3000, where="engine")
    big = task_limits(folders["big"], s, tiny)
    assert (big.cpus, big.memory_mb) == (1, 3000)
    assert "cpus of 1 task(s) (the engine has 1 CPUs), memory of 1 task(s) (the engine has 3000 MB)" in summary(
        list(folders.values()), s, tiny)
