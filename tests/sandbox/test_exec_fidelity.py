"""A command in our sandbox sees the process environment `docker exec` gives (issue 45).

One probe script runs through our sandbox and through plain `docker exec` in a container of the
same image (and, on the runc backend, through plain `runc exec` in the same sandbox), and the
two outputs are compared field by field: signal dispositions and mask, umask, resource limits,
environment, open file descriptors and stdin, session and process group, working directory,
user. Every difference that remains is named below with its reason (and in the README's "What a
command sees"); a difference not named, or a named one that is gone, fails the test. Then SIGINT:
a Python program catches the KeyboardInterrupt another command sends it, on every backend.
"""
from __future__ import annotations

import io
import re
import signal
import subprocess
import uuid

import pytest

from hermes.sandbox import get_backend
from hermes.sandbox.base import SandboxSettings, SandboxSpec, TaskProfile

pytestmark = pytest.mark.docker
RUN_ID = f"pytest-fidelity-{uuid.uuid4().hex[:6]}"
TASK_IMAGE = "hermes-fidelity-task:test"
#: a task image as a published task makes one: its own USER, WORKDIR and ENV
TASK_DOCKERFILE = """FROM {base}
USER root
WORKDIR /app
ENV TASK_MODE=graded PIP_NO_INDEX=1
"""

PROBE = r"""echo "== shell"; cat /proc/$$/status
echo "== child"; cat /proc/self/status
echo "== umask"; umask
echo "== limits"; cat /proc/self/limits
echo "== env"; env
echo "== fds"; ls -l /proc/$$/fd
echo "== stat"; cat /proc/$$/stat
echo "== cwd"; pwd
echo "== id"; id -u; id -g; id -G
echo "== hostname"; cat /proc/sys/kernel/hostname
echo "== end"
"""

# Every deliberate difference from `docker exec`, with its reason. The README says the same.
MERGED = "stdout and stderr are one stream, in order (the model reads one text); docker exec keeps two pipes"
PARENT = ("the command's parent is the sandbox's wrapper (its time limit and end marker); under docker exec "
          "the shell's parent is outside the container (PPID 0)")
TMPDIR = "the default profile sets TMPDIR=/tmp: its root is read-only and /tmp is the writable tmpfs"
NO_PROFILE = ("the runc backend has no task profile: a task image runs under the default one "
              "(the settings' user, in the work dir), the docker backend runs it as published")
RUNC_STDIN = "runc exec relays its own stdin through a pipe (here /dev/null's EOF); docker exec and we give /dev/null"
DELIBERATE = {
    ("docker", "default"): {"stderr_is_stdout": MERGED, "parent": PARENT, "env.TMPDIR": TMPDIR},
    ("docker", "task"): {"stderr_is_stdout": MERGED, "parent": PARENT},
    ("runc", "default"): {"stderr_is_stdout": MERGED, "parent": PARENT, "env.TMPDIR": TMPDIR},
    ("runc", "task"): {"stderr_is_stdout": MERGED, "parent": PARENT, "env.TMPDIR": TMPDIR, "uid": NO_PROFILE,
                       "gid": NO_PROFILE, "groups": NO_PROFILE, "cwd": NO_PROFILE, "env.PWD": NO_PROFILE},
    ("runc exec", "default"): {"stderr_is_stdout": MERGED, "parent": PARENT, "fd.0": RUNC_STDIN},
    ("runc exec", "task"): {"stderr_is_stdout": MERGED, "parent": PARENT, "fd.0": RUNC_STDIN},
}


def fields(text: str) -> dict[str, str]:
    """The probe's output as named fields, with what always differs between two containers
    (a pipe's inode, the hostname's value) made comparable."""
    sections: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("== "):
            name = line[3:]
            sections[name] = []
        elif name:
            sections[name].append(line)
    assert "end" in sections, f"the probe did not finish:\n{text}"
    out: dict[str, str] = {}
    for part in ("shell", "child"):
        for line in sections[part]:
            key, _, value = line.partition(":")
            # the shell's own mask is not compared: dash blocks every signal for a moment around
            # each fork, and the probe's `cat` can read it then; its children's mask is the one they run with
            if key in (("SigIgn", "SigCgt") if part == "shell" else ("SigIgn", "SigBlk")):
                out[f"{part}.{key}"] = value.strip()
    out["umask"] = sections["umask"][0]
    for line in sections["limits"][1:]:
        m = re.match(r"(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)", line)
        if m:
            out[f"limit.{m.group(1)}"] = f"{m.group(2)} {m.group(3)}"
    hostname = sections["hostname"][0]
    for line in sections["env"]:
        key, _, value = line.partition("=")
        out[f"env.{key}"] = "<the container's hostname>" if key == "HOSTNAME" and value == hostname else value
    fds = {}
    for line in sections["fds"]:
        if " -> " in line:
            left, target = line.split(" -> ", 1)
            fds[left.split()[-1]] = target
    for fd, target in fds.items():
        out[f"fd.{fd}"] = re.sub(r":\[\d+\]$", "", target)
    out["stderr_is_stdout"] = str(fds.get("1") == fds.get("2"))
    stat = sections["stat"][0]
    pid = int(stat.split()[0])
    ppid, pgrp, session, tty, tpgid = (int(x) for x in stat[stat.rindex(")") + 2:].split()[1:6])
    out["group leader"] = str(pgrp == pid)
    out["session leader"] = str(session == pid)
    out["parent"] = "outside the container" if ppid == 0 else "a process in the sandbox"
    out["tty"], out["tpgid"] = str(tty), str(tpgid)
    out["cwd"] = sections["cwd"][0]
    out["uid"], out["gid"], out["groups"] = sections["id"][:3]
    return out


def differences(ours: dict[str, str], theirs: dict[str, str]) -> dict[str, tuple]:
    return {k: (ours.get(k), theirs.get(k)) for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)}


def check(ours: dict[str, str], theirs: dict[str, str], named: dict[str, str], what: str) -> None:
    found = differences(ours, theirs)
    unnamed = {k: v for k, v in found.items() if k not in named}
    gone = sorted(set(named) - set(found))
    assert not unnamed and not gone, (
        f"{what}: differences nobody named (ours, theirs): {unnamed}; named but no longer there: {gone}")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def engine(docker_engine):
    """A client of its own with a patient timeout: on a loaded machine (8 suites on 2 cores) a
    container's start or removal took longer than the shared client's 10 s."""
    import docker

    client = docker.from_env(timeout=300)
    yield client
    client.close()


@pytest.fixture(scope="module")
def images(default_image, engine):
    engine.images.build(fileobj=io.BytesIO(TASK_DOCKERFILE.format(base=default_image).encode()),
                               tag=TASK_IMAGE, pull=False, rm=True)
    return {"default": default_image, "task": TASK_IMAGE}


def docker_exec(engine, image: str) -> dict[str, str]:
    """The probe under plain `docker exec`, in a plain container of the image."""
    box = engine.containers.run(image, ["sleep", "300"], detach=True, network_mode="none",
                                       labels={"hermes-batch.test": RUN_ID})
    try:
        done = subprocess.run(["docker", "exec", box.id, "sh", "-c", PROBE], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        return fields(done.stdout)
    finally:
        box.remove(force=True)


def open_box(backend: str, image: str, kind: str):
    settings = SandboxSettings(backend=backend, command_timeout=30, output_limit=200_000)
    found = get_backend(settings)
    if not found.available():
        pytest.fail(f"the {backend} backend is not available here")
    return found.open(SandboxSpec(image=image, run_id=RUN_ID, prompt_id=f"fidelity-{kind}",
                                  profile=TaskProfile() if kind == "task" else None))


# --------------------------------------------------------------------------- the differential test


@pytest.mark.parametrize("kind", ["default", "task"])
@pytest.mark.parametrize("backend", ["docker", "runc"])
def test_a_command_sees_what_docker_exec_gives_but_the_named_differences(backend, kind, images, engine):
    theirs = docker_exec(engine, images[kind])
    box = open_box(backend, images[kind], kind)
    try:
        result = box.exec(PROBE)
        assert result.exit_code == 0, result.output
        ours = fields(result.output)
        if backend == "runc":  # plain `runc exec` in the same sandbox: the wrapper's own effect
            from hermes.sandbox.runc import state

            plain = subprocess.run(["runc", "--root", str(state.RUNC_ROOT), "exec", "--user", f"{box.uid}:{box.gid}",
                                    "--cwd", box.cwd, box.name, "sh", "-c", PROBE],
                                   capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            assert plain.returncode == 0, plain.stderr
            check(ours, fields(plain.stdout), DELIBERATE[("runc exec", kind)], f"runc, {kind} image, against runc exec")
    finally:
        box.close()
    assert ours["shell.SigIgn"] == ours["child.SigIgn"] == "0000000000000000"  # issue 45's SIGINT and SIGQUIT
    check(ours, theirs, DELIBERATE[(backend, kind)], f"{backend}, {kind} image, against docker exec")


# --------------------------------------------------------------------------- SIGINT


CATCH = ("(sleep 1; kill -INT $$) & exec python3 -c '"
         "import time\ntry:\n    time.sleep(20)\n    print(\"slept on\")\n"
         "except KeyboardInterrupt:\n    print(\"KeyboardInterrupt\")'")


@pytest.mark.parametrize("backend", ["docker", "runc", "local"])
def test_python_catches_the_sigint_another_command_sends(backend, images):
    # As when the run itself was started with SIGINT ignored (nohup, a shell's background job):
    # what the host process ignores must not reach the sandbox's programs either.
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        settings = SandboxSettings(backend=backend, command_timeout=30, output_limit=2000)
        box = get_backend(settings).open(SandboxSpec(image=images["default"], run_id=RUN_ID, prompt_id="sigint"))
        try:
            result = box.exec(CATCH)
        finally:
            box.close()
    finally:
        signal.signal(signal.SIGINT, before)
    assert (result.output, result.exit_code) == ("KeyboardInterrupt\n", 0)
