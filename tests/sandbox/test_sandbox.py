"""Sandboxes against a real Docker engine (a missing engine is a skip locally, a failure under CI),
plus the local backend and the output cap, which need no engine."""
from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from hermes.sandbox import cleanup, open_sandbox
from hermes.sandbox.base import (
    LABEL_PROMPT,
    LABEL_RUN,
    ExecResult,
    ImageUnavailable,
    OutputCap,
    Sandbox,
    SandboxError,
    SandboxSettings,
    SandboxSpec,
)
from hermes.sandbox.docker.engine import all_dropped
from hermes.sandbox.local import LocalSandbox, plain_words
from tests.helpers import LoopbackListener, interfaces, routes, unique_sleep, unpullable_image, until, within


RUN_ID = f"pytest-{uuid.uuid4().hex[:8]}"


def _ours(run_id: str = RUN_ID) -> list[dict]:
    from hermes.sandbox.docker.engine import get_client

    return get_client().api.containers(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})


@pytest.fixture(scope="module")
def image(sandbox_image):
    """The default image on the real engine (conftest's docker_engine: a missing engine fails under CI)."""
    yield sandbox_image
    leftovers = _ours()
    cleanup(RUN_ID)
    assert not leftovers, f"tests left containers behind: {[c['Names'] for c in leftovers]}"


#: the backends that isolate: a test of what a sandbox does, not of how the engine made it, runs on each
both_backends = pytest.mark.parametrize("backend", ["docker", "runc"])


@pytest.fixture
def backend() -> str:
    """docker, unless the test runs on both_backends."""
    return "docker"


@pytest.fixture
def settings(backend, runc_backend) -> SandboxSettings:
    return SandboxSettings(backend=backend, command_timeout=30, output_limit=2000)


@pytest.fixture
def runc_backend(backend, request):
    """On the runc backend: skipped where runc cannot run here; its sandboxes of this module must all be gone."""
    if backend != "runc":
        yield None
        return
    from hermes.sandbox import get_backend

    runc = get_backend(SandboxSettings(backend="runc"))
    if not runc.available():
        pytest.skip("the runc backend needs runc and root")
    yield runc
    assert runc.drain(60)
    left = [f.name for f in runc.leftovers(RUN_ID) if f.run == RUN_ID and f.alive]
    assert left == [], f"{request.node.name} left runc sandboxes behind: {left}"


@pytest.fixture
def make(image, settings, request):
    """make(cwd=None, **settings overrides) -> a started DockerSandbox, closed after the test."""
    made = []

    def _make(cwd: str | None = None, **overrides):
        s = settings.model_copy(update=overrides)
        sb = open_sandbox(SandboxSpec(image=image, cwd=cwd, run_id=RUN_ID, prompt_id=request.node.name), s)
        made.append(sb)
        return sb

    yield _make
    for sb in made:
        sb.close()


@pytest.fixture
def sb(make):
    return make()


# --------------------------------------------------------------------------- docker


docker_test = pytest.mark.docker


@docker_test
@both_backends
def test_protocol_and_basic_command(sb):
    assert isinstance(sb, Sandbox)
    r = sb.exec("echo hello; echo oops >&2")
    assert isinstance(r, ExecResult)
    assert (r.exit_code, r.timed_out, r.truncated) == (0, False, False)
    assert r.output == "hello\noops\n"


@docker_test
@both_backends
def test_exit_codes(sb):
    assert sb.exec("exit 3").exit_code == 3
    assert sb.exec("false").exit_code == 1
    assert sb.exec("no-such-command-xyz").exit_code == 127
    r = sb.exec("echo partial; kill -9 $$")
    assert r.exit_code == 137 and not r.timed_out and "partial" in r.output


@docker_test
@both_backends
def test_output_order_is_kept(sb):
    r = sb.exec("for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; done")
    assert r.output.split() == [f"{k}{i}" for i in range(1, 6) for k in ("out", "err")]


@docker_test
@both_backends
def test_cwd_honoured_and_writable(make):
    sb = make(cwd="/project/src")
    r = sb.exec("pwd; touch made-here && ls")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == ["/project/src", "made-here"]
    # default workdir and /tmp are writable, and a per-call cwd is created on demand
    assert sb.exec("pwd; touch x", cwd="/workspace").output.strip() == "/workspace"
    r = sb.exec("pwd; touch y", cwd="deeper/still")
    assert (r.exit_code, r.output.strip()) == (0, "/project/src/deeper/still")
    assert sb.exec("touch /tmp/ok").exit_code == 0


@docker_test
@both_backends
def test_first_use_of_a_cwd_below_the_workdir_can_be_a_file_write(make):
    # No exec has created the cwd yet: the write must still land in it, not in /.
    sb = make(cwd="/workspace/project")
    sb.write_file("notes/a.txt", b"first")
    assert sb.read_file("/workspace/project/notes/a.txt") == b"first"
    assert sb.exec("pwd; cat notes/a.txt").output == "/workspace/project\nfirst"


@docker_test
@both_backends
def test_default_cwd_is_workdir(sb):
    r = sb.exec("pwd; touch a && echo ok")
    assert r.output.split() == ["/workspace", "ok"]


@docker_test
@both_backends
def test_files_round_trip(sb):
    sb.write_file("notes/hello.txt", "héllo\n".encode())
    assert sb.read_file("notes/hello.txt") == "héllo\n".encode()
    assert sb.read_file("/workspace/notes/hello.txt") == "héllo\n".encode()
    assert sb.exec("cat notes/hello.txt").output == "héllo\n"
    binary = bytes(range(256)) * 7 + b"\x00\n\r\xff"
    sb.write_file("/tmp/deep/er/bin.dat", binary)
    assert sb.read_file("/tmp/deep/er/bin.dat") == binary
    big = os.urandom(3 * 1024 * 1024)
    sb.write_file("big.bin", big)
    assert sb.read_file("big.bin") == big
    assert sb.exec("wc -c < big.bin").output.strip() == str(len(big))
    sb.write_file("empty", b"")
    assert sb.read_file("empty") == b""


@docker_test
@both_backends
def test_file_errors(sb):
    with pytest.raises(FileNotFoundError):
        sb.read_file("missing.txt")
    sb.exec("mkdir -p adir")
    with pytest.raises(IsADirectoryError):
        sb.read_file("adir")
    with pytest.raises(IsADirectoryError):
        sb.write_file("adir", b"x")
    with pytest.raises(PermissionError):
        sb.write_file("/etc/x", b"x")


@docker_test
@both_backends
def test_time_limit_kills_the_command(sb):
    r = sb.exec("echo begun; sleep 100; echo never", timeout=2)
    assert r.timed_out and r.exit_code == -1
    assert r.output.startswith("begun\n") and "never" not in r.output
    assert "sleep 100" not in sb.exec("ps -o args | grep -v grep").output  # killed, not left running
    # children and background jobs of a killed command die with it
    r = sb.exec("sleep 101 & sleep 102 & echo started; sleep 103", timeout=1)
    assert r.timed_out and "started" in r.output
    assert "sleep 10" not in sb.exec("ps -o args | grep -v grep").output


@docker_test
@both_backends
def test_background_process_returns_at_once(sb):
    # A call that waited for its background job would end at its own time limit (5 s), not at 30.
    r = sb.exec("sleep 30 & echo launched", timeout=5)
    assert (r.exit_code, r.timed_out, r.output) == (0, False, "launched\n")
    assert "sleep 30" in sb.exec("ps -o args").output  # still running: background jobs survive


@docker_test
@both_backends
def test_endless_output_is_capped(sb):
    r = sb.exec("yes hermes", timeout=300)
    assert r.truncated and not r.timed_out  # killed for its flood, long before its time limit
    head, _, tail = r.output.partition("\n[output truncated: ")
    assert len(head) == 2000 and head.startswith("hermes\nhermes\n")
    assert tail.split(" ", 1)[0].isdigit() and "more bytes]" in tail
    assert r.exit_code == -1 and "[command killed" in r.output


@docker_test
@both_backends
def test_long_output_counts_what_was_cut(sb):
    r = sb.exec("seq 1 20000")
    full = "".join(f"{i}\n" for i in range(1, 20001))
    assert r.exit_code == 0 and r.truncated
    assert r.output == full[:2000] + f"\n[output truncated: {len(full) - 2000} more bytes]"


@docker_test
@both_backends
def test_every_byte_of_a_command_and_its_cwd_arrives_as_written(make):
    """The channel hands a request's arguments over as shell words: quotes, newlines, `$(...)`,
    backslashes and bytes that are not UTF-8 reach the sandbox unchanged (NUL cannot be in a command)."""
    text = "".join(map(chr, range(1, 128))) + "\n'\"$(touch pwned)`\\'\n" + bytes(range(128, 256)).decode("utf-8", "surrogateescape")
    cwd = "/tmp/we ird'\n$(touch pwned2) \\dir"
    sb = make(cwd=cwd)
    r = sb.exec(f"cat > out <<'HERMES_END'\n{text}\nHERMES_END\npwd")
    assert (r.exit_code, r.output) == (0, cwd + "\n"), r
    assert sb.read_file("out") == text.encode("utf-8", "surrogateescape") + b"\n"
    made = "for d in / /tmp /workspace \"$PWD\"; do ls -d \"$d/pwned\" \"$d/pwned2\"; done 2>/dev/null | wc -l"
    assert sb.exec(made).output.strip() == "0"


@docker_test
@both_backends
def test_invalid_utf8_survives(sb):
    r = sb.exec(r"printf 'ok \377\376 end\n'")
    assert r.exit_code == 0
    assert r.output.startswith("ok ") and r.output.endswith(" end\n") and "\ufffd" in r.output


# "No network" is proved without sending anything off the machine: the container's own
# interfaces and routes (a loopback and nothing else, no route anywhere: every other address is
# unreachable before a packet is made), and a listener of the test's own on the host's loopback,
# which the sandbox dials at 127.0.0.1 and must not reach (its 127.0.0.1 is its own).


def network_probe(sb, port: int) -> dict:
    return {"interfaces": interfaces(sb.exec("cat /proc/net/dev").output),
            "routes": routes(sb.exec("cat /proc/net/route").output),
            "dial": sb.exec(f"nc -w 2 127.0.0.1 {port} </dev/null; echo rc=$?", timeout=20).output}


@docker_test
@both_backends
def test_no_network(sb):
    with LoopbackListener() as host:
        probe = network_probe(sb, host.port)
    assert probe["interfaces"] == ["lo"] and probe["routes"] == [], probe
    assert "Connection refused" in probe["dial"] and "rc=0" not in probe["dial"], probe
    assert host.accepted == []  # the host's listener saw nothing


@docker_test
def test_the_network_probe_sees_a_network_when_there_is_one(image, docker_engine):
    """The probe can fail: a container on the engine's default network has an eth0 and a route;
    one in the host's network namespace reaches the test's listener. Neither is dialled anywhere
    but this host's loopback (the probe only reads /proc and dials 127.0.0.1)."""
    labels = {LABEL_RUN: RUN_ID}
    with LoopbackListener() as host:
        out = docker_engine.containers.run(image, ["sh", "-c", "cat /proc/net/dev; echo ==; cat /proc/net/route"],
                                           network_mode="bridge", remove=True, labels=labels).decode()
        dev, route = out.split("==\n")
        assert "eth0" in interfaces(dev) and routes(route), out
        dial = docker_engine.containers.run(image, ["sh", "-c", f"nc -w 2 127.0.0.1 {host.port} </dev/null; echo rc=$?"],
                                            network_mode="host", remove=True, labels=labels).decode()
        until(lambda: host.accepted, "the host-network container's connection", timeout=30)
    assert "rc=0" in dial and len(host.accepted) == 1


@docker_test
@both_backends
def test_root_filesystem_is_read_only(sb):
    r = sb.exec("touch /etc/x")
    assert r.exit_code != 0 and "Read-only file system" in r.output
    assert sb.exec("touch /x").exit_code != 0


@docker_test
@both_backends
def test_unprivileged(sb):
    assert sb.exec("id -u").output.strip() != "0"
    status = sb.exec("cat /proc/self/status").output
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    assert fields["CapEff"].strip() == "0000000000000000"
    assert fields["NoNewPrivs"].strip() == "1"


@docker_test
def test_limits_applied(sb):
    hc = sb.api.inspect_container(sb.container_id)["HostConfig"]
    assert hc["Memory"] == 1 << 30 and hc["MemorySwap"] == 1 << 30
    assert hc["NanoCpus"] == 1_000_000_000 and hc["PidsLimit"] == 256
    # Docker keeps CapDrop ["ALL"]; Podman's Docker API lists its default capabilities instead
    assert hc["ReadonlyRootfs"] and all_dropped(hc["CapDrop"], hc["CapAdd"]) and "no-new-privileges" in hc["SecurityOpt"]
    assert hc["NetworkMode"] == "none" and hc["Init"]
    assert hc["AutoRemove"]  # its main process's end removes it (issue 34: nothing outlives its deadline)
    assert set(hc["Tmpfs"]) == {"/tmp", "/workspace"}


@docker_test
def test_pids_limit_stops_a_fork_loop(make):
    sb = make(pids_limit=64)
    r = sb.exec("i=0; while [ $i -lt 1000 ]; do sleep 60 & i=$((i+1)); done; echo all-started", timeout=30)
    assert "all-started" not in r.output
    assert "fork" in r.output.lower() or "resource temporarily unavailable" in r.output.lower()
    procs = sb.api.top(sb.container_id)["Processes"]
    sleepers = [p for p in procs if "sleep 60" in " ".join(p)]
    assert len(procs) <= 64  # at least 936 of the 1000 never started
    assert len(sleepers) >= 32, procs  # the loop did fork, up to the limit: it was stopped by it, not before
    sb.close()
    assert not [c for c in _ours() if c["Id"] == sb.container_id]


@docker_test
@both_backends
def test_memory_limit_and_a_dead_container(make):
    sb = make(memory="64m", tmpfs_size="256m")
    r = sb.exec("x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}", timeout=30)
    assert r.exit_code != 0 and "200000000" not in r.output  # the hog was killed
    # tmpfs pages count against the memory limit: a 100 MB file cannot fit in 64 MB. The
    # writer is killed, or the whole container is (then the sandbox says so: SandboxError)
    try:
        for i in range(3):
            r = sb.exec(f"head -c 100000000 /dev/zero > /tmp/fill{i} && echo stored", timeout=30)
            assert r.exit_code != 0 and "stored" not in r.output
        sizes = sb.exec("wc -c /tmp/fill* | grep -v total").output.split()[::2]
        assert sizes and all(int(n) < 64 << 20 for n in sizes), sizes  # none of the files fit
    except SandboxError as e:
        assert "stopped" in str(e) or "not running" in str(e)
        # the memory limit ended it, nothing else: the engine's OOMKilled, read off its events
        # once the engine removed the dead container (AutoRemove)
        assert "OOM-killed" in str(e), e
    sb.close()


@docker_test
@both_backends
def test_two_sandboxes_are_separate(make):
    a, b = make(), make()
    assert a.exec("hostname").output != b.exec("hostname").output
    a.write_file("mine", b"a")
    with pytest.raises(FileNotFoundError):
        b.read_file("mine")


@docker_test
def test_labels(make, request):
    sb = make()
    labels = sb.api.inspect_container(sb.container_id)["Config"]["Labels"]
    assert labels[LABEL_RUN] == RUN_ID and labels[LABEL_PROMPT] == request.node.name


@docker_test
def test_close_removes_the_container(make):
    sb = make()
    cid = sb.container_id
    assert any(c["Id"] == cid for c in _ours())
    sb.close()
    sb.close()  # idempotent
    assert not any(c["Id"] == cid for c in _ours())
    with pytest.raises(SandboxError):
        sb.exec("true")


@docker_test
def test_context_manager(image, settings):
    with open_sandbox(SandboxSpec(image=image, run_id=RUN_ID), settings) as sb:
        cid = sb.container_id
        assert sb.exec("echo in").output == "in\n"
    assert not any(c["Id"] == cid for c in _ours())


@docker_test
def test_unavailable_image(image, settings):
    from hermes.sandbox.docker.engine import ensure_image

    name = unpullable_image()  # its registry is a closed port on loopback: no public registry is asked
    with pytest.raises(ImageUnavailable, match=f"image not available: {re.escape(name)}"):
        ensure_image(name, pull_timeout=20)
    with pytest.raises(ImageUnavailable, match=f"image not available: {re.escape(name)}"):  # cached: no second pull
        open_sandbox(SandboxSpec(image=name, run_id=RUN_ID), settings)
    assert ensure_image(image) == image


@docker_test
def test_an_image_is_known_only_once_found_and_a_missing_one_never(image, settings):
    # A prompt on the run's loop asks image_known() and skips its trip to a thread for the
    # image check only when the check is already settled: a missing image is always checked.
    from hermes.sandbox import get_backend

    backend = get_backend(settings)
    name = unpullable_image()
    assert not backend.image_known(name)
    with pytest.raises(ImageUnavailable):
        backend.ensure_image(name)
    assert not backend.image_known(name)
    backend.ensure_image(image)
    assert backend.image_known(image)
    assert get_backend(settings.model_copy(update={"backend": "local"})).image_known(name)  # no images there


@docker_test
def test_system_cwd_gets_no_tmpfs_and_says_so(make, caplog):
    with caplog.at_level(logging.WARNING, logger="hermes.sandbox.docker.container"):
        sb = make(cwd="/etc")
        make(cwd="/etc")
    said = [r.getMessage() for r in caplog.records if "READ-ONLY" in r.getMessage()]
    assert len(said) == 1 and "sandbox cwd /etc" in said[0] and "it is a system path" in said[0]  # once, plainly
    assert sb.exec("pwd; ls passwd").output.split() == ["/etc", "passwd"]
    assert sb.exec("touch here").exit_code != 0


@docker_test
def test_shared_memory_is_capped_like_the_work_space(make):
    sb = make(tmpfs_size="8m")
    r = sb.exec("dd if=/dev/zero of=/dev/shm/fill bs=1M count=100")
    assert r.exit_code != 0 and "No space left on device" in r.output
    assert sb.api.inspect_container(sb.container_id)["HostConfig"]["ShmSize"] == 8 << 20


@docker_test
def test_image_volumes_become_capped_tmpfs(image, settings, docker_image_with_volume):
    sb = open_sandbox(SandboxSpec(image=docker_image_with_volume, run_id=RUN_ID), settings.model_copy(update={"tmpfs_size": "8m"}))
    try:
        info = sb.api.inspect_container(sb.container_id)
        assert "/data" in info["HostConfig"]["Tmpfs"]
        assert not [m for m in info["Mounts"] if m["Type"] == "volume"]  # no host directory behind it
        r = sb.exec("dd if=/dev/zero of=/data/fill bs=1M count=100")
        assert r.exit_code != 0 and "No space left on device" in r.output
    finally:
        sb.close()


@pytest.fixture(scope="module")
def docker_image_with_volume(image):
    from hermes.sandbox.docker.engine import get_client

    client = get_client()
    tag = f"hermes-test-volume:{uuid.uuid4().hex[:8]}"
    client.images.build(fileobj=io.BytesIO(f"FROM {image}\nVOLUME /data\n".encode()), tag=tag, rm=True, pull=False)
    yield tag
    client.images.remove(tag, force=True)


@docker_test
@both_backends
def test_out_of_memory_is_named_in_the_output(make):
    sb = make(memory="64m", tmpfs_size="8m")
    r = sb.exec("dd if=/dev/zero of=/dev/null bs=200M count=1")  # one 200 MB buffer
    assert r.exit_code == 137 and "ran out of memory (limit 64m)" in r.output
    r = sb.exec("echo survived; kill -9 $$")  # a SIGKILL that is not the memory limit's
    assert r.exit_code == 137 and "out of memory" not in r.output


@docker_test
def test_the_engine_applies_every_limit_asked(image):
    from hermes.sandbox.docker.container import limit_problems

    assert limit_problems(SandboxSettings(), run_id=RUN_ID) == []
    problems = limit_problems(SandboxSettings(memory="0"), run_id=RUN_ID)  # "0" means none at all
    assert any(p.startswith("memory limit") for p in problems)
    assert _ours() == []  # probes are removed


@docker_test
@both_backends
def test_quick_commands_are_not_held_by_their_timer(sb):
    # Every command starts a timer beside it; one that held up a finished command would make it
    # last until the timer fires (20 s) and end timed out. A bound on what happened, not a speed.
    results = [sb.exec("true", timeout=20) for _ in range(30)]
    assert all(r.exit_code == 0 and not r.timed_out for r in results)
    assert max(r.duration for r in results) < 20


@docker_test
@both_backends
def test_unenterable_cwd_is_reported(sb):
    r = sb.exec("pwd", cwd="/not-there/at-all")  # outside every tmpfs: the root is read-only
    assert r.exit_code == 126 and "not-there" in r.output


@docker_test
def test_without_setsid_the_time_limit_still_kills(sb, monkeypatch):
    from hermes.sandbox.docker import channel

    monkeypatch.setattr(channel, "WRAPPER", channel.WRAPPER.replace("command -v setsid", "false"))
    r = within(60, sb.exec, "sleep 100", timeout=1)
    assert r.timed_out and r.exit_code == -1
    assert "sleep 100" not in sb.exec("ps -o args | grep -v grep").output
    assert sb.exec("echo fine").output == "fine\n"


@docker_test
def test_host_side_bound_when_the_timer_fails(sb, monkeypatch):
    from hermes.sandbox.docker import channel
    from hermes.sandbox.docker import sandbox as backend

    monkeypatch.setattr(channel, "WRAPPER", channel.WRAPPER.replace('sleep "$1" &&', 'sleep 1000 &&'))
    monkeypatch.setattr(backend, "HOST_GRACE", 1.0)
    r = within(60, sb.exec, "sleep 77", timeout=1)  # the in-box timer would wait 1000 s: the host ends it
    assert r.timed_out and r.exit_code == -1
    assert "sleep 77" not in sb.exec("ps -o args | grep -v grep").output  # killed from the host


@docker_test
def test_the_real_engines_limits_are_read_as_it_reports_them(docker_engine):
    from hermes.sandbox.docker import engine as backend

    info = docker_engine.info()
    expected = sorted(flag for flag in ("MemoryLimit", "SwapLimit", "CpuCfsQuota", "PidsLimit") if info.get(flag) is False)
    problems = backend.engine_problems(docker_engine)
    assert sorted(flag for flag in ("MemoryLimit", "SwapLimit", "CpuCfsQuota", "PidsLimit")
                  if any(f"{flag}=false" in p for p in problems)) == expected
    assert len([p for p in problems if p.startswith("engine warning:")]) == len(info.get("Warnings") or [])


def test_engine_limits_that_cannot_apply_are_logged(caplog):
    """The path the engine above cannot show (every limit applies on it): an engine that lacks some."""
    from hermes.sandbox.docker import engine as backend

    class FakeAPI:
        base_url = f"fake://{uuid.uuid4().hex}"

    class FakeClient:
        api = FakeAPI()

        def info(self):
            return {"MemoryLimit": True, "SwapLimit": False, "CpuCfsQuota": True, "PidsLimit": False,
                    "SecurityOptions": ["name=seccomp,profile=default"], "Warnings": ["WARNING: No swap limit support"]}

    with caplog.at_level("WARNING"):
        problems = backend.engine_problems(FakeClient())
    assert any("pids limit" in p for p in problems) and any("swap" in p for p in problems)
    assert "SANDBOX HARDENING NOT APPLIED" in caplog.text and "pids limit" in caplog.text


# --------------------------------------------------------------------------- local (no engine)


@pytest.fixture
def local():
    sb = LocalSandbox(SandboxSpec(image="ignored", cwd="/project/src"),
                      SandboxSettings(backend="local", command_timeout=30, output_limit=2000))
    yield sb
    sb.close()


def test_local_basics(local):
    assert isinstance(local, Sandbox)
    r = local.exec("pwd; echo err >&2; exit 4")
    assert r.exit_code == 4
    where, err = r.output.splitlines()
    assert where == str(local.root / "project/src") and err == "err"
    assert not os.path.exists("/project/src") or where != "/project/src"


def test_local_files(local):
    local.write_file("a/b.txt", b"\x00\xffdata")
    assert local.read_file("a/b.txt") == b"\x00\xffdata"
    assert local.read_file("/project/src/a/b.txt") == b"\x00\xffdata"
    assert local.exec("cat a/b.txt").output.endswith("data")
    local.write_file("/etc/passwd", b"not the host's")  # mapped inside the temp folder
    assert (local.root / "etc/passwd").read_bytes() == b"not the host's"
    with pytest.raises(FileNotFoundError):
        local.read_file("missing")
    local.exec("ln -s / escape")
    with pytest.raises(PermissionError):
        local.read_file("escape/etc/hostname")


def test_local_time_limit_kills_the_group(local):
    background, foreground = unique_sleep(100), unique_sleep(101)  # the host's ps lists every worker's
    r = local.exec(f"{background} & {foreground}; echo never", timeout=1)
    assert r.timed_out and r.exit_code == -1 and "never" not in r.output
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert background not in ps and foreground not in ps


def test_local_plain_commands_skip_the_shell_and_behave_as_under_it(local):
    assert plain_words("cat /etc/hostname") == ["cat", "/etc/hostname"]
    assert plain_words("  python3  main.py --n=2 ") == ["python3", "main.py", "--n=2"]
    for needs_the_shell in ["echo hi", "cd x", "FOO=1 env", "ls *.txt", "cat $HOME", "ls; ls", "ls | wc", "ls > f",
                            "ls 'a b'", "ls ~", "ls\nls", "ls\tx", "true", "[ -d x ]", "", "  "]:
        assert plain_words(needs_the_shell) is None, needs_the_shell

    local.write_file("notes.txt", b"one\ntwo\n")
    local.write_file("noshebang", b"echo from a script without a shebang\n")
    os.chmod(local.host_path("noshebang"), 0o755)
    local.write_file("notexec.sh", b"#!/bin/sh\necho never\n")
    for command in ["cat notes.txt", "wc -l notes.txt", "env", "ls -a ..", "nosuchcommand --flag",
                    "./noshebang", "./notexec.sh", "cat missing.txt", "sh -c exit"]:
        mine = local.exec(command)
        under_sh = subprocess.run(["/bin/sh", "-c", command], cwd=local.host_path(), env=local._env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if command == "env":  # the shell's own PWD included
            assert sorted(mine.output.splitlines()) == sorted(under_sh.stdout.splitlines())
            assert f"PWD={os.path.realpath(local.host_path())}" in mine.output.splitlines()
        else:
            assert (mine.exit_code, mine.output) == (under_sh.returncode, under_sh.stdout), command
    assert local.exec("nosuchcommand").exit_code == 127

    held = unique_sleep(37)
    r = local.exec(held, timeout=1)  # its own process group, killed at the limit like a shell's
    assert r.timed_out and r.exit_code == -1
    assert held not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_local_output_cap_and_utf8(local):
    r = local.exec("yes", timeout=20)
    assert r.truncated and "\n[output truncated: " in r.output and r.exit_code == -1
    r = local.exec(r"printf 'a\377b'")
    assert r.output == "a\ufffdb"


def test_local_close_removes_folder(local):
    root = local.root
    assert root.is_dir()
    local.close()
    local.close()
    assert not root.exists()


def test_local_folders_closed_in_the_background_are_gone_once_the_backend_drained():
    from hermes.sandbox import get_backend

    backend = get_backend(SandboxSettings(backend="local"))
    boxes = [backend.open(SandboxSpec(image="x")) for _ in range(20)]
    held = unique_sleep(61)
    for i, box in enumerate(boxes):
        box.write_file(f"deep/{i}/notes.txt", b"x" * 1000)
        started = box.exec(f"{held} & echo started")  # a command left running is killed at close, not later
        assert started.output.strip() == "started"
        box.close(wait=False)
        with pytest.raises(SandboxError):
            box.exec("true")
    assert backend.drain(30)
    assert not [b.root for b in boxes if b.root.exists()]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert held not in ps


def test_local_folders_are_made_in_the_temporary_folder_or_where_settings_say(tmp_path):
    box = LocalSandbox(SandboxSpec(image="x"), SandboxSettings(backend="local"))
    try:
        assert box.root.parent == Path(tempfile.gettempdir()).resolve()
    finally:
        box.close()
    chosen = tmp_path / "in-memory-or-not"
    box = LocalSandbox(SandboxSpec(image="x"), SandboxSettings(backend="local", local_dir=str(chosen)))
    try:
        assert box.root.parent == chosen.resolve()
        box.write_file("notes/a.txt", b"kept here")
        assert box.exec("cat notes/a.txt; echo; pwd").output.splitlines() == ["kept here", str(box.root / "workspace")]
    finally:
        box.close()
    assert not box.root.exists() and chosen.is_dir()


def test_a_dead_process_s_local_folders_are_removed_when_a_run_starts_and_live_ones_kept(tmp_path):
    from hermes.sandbox import get_backend

    settings = SandboxSettings(backend="local", local_dir=str(tmp_path))
    backend = get_backend(settings)
    live = backend.open(SandboxSpec(image="x"))
    live.write_file("work.txt", b"in use")
    # a folder as a process that was killed left it: same host, a pid no longer running
    child = subprocess.Popen(["true"])
    child.wait()
    maker = live.root.name.rsplit("-", 2)[0]  # hermes-local-<host>
    dead = tmp_path / f"{maker}-{child.pid}-abcd1234"
    (dead / "workspace").mkdir(parents=True)
    (dead / "workspace" / "big.bin").write_bytes(b"x" * 4096)
    stranger = tmp_path / "hermes-local-elsewhere-1-zzz"  # another host's (a shared folder): not ours to judge
    stranger.mkdir()
    try:
        found = {f.name: f.alive for f in backend.leftovers()}
        assert found == {live.root.name: True, dead.name: False}
        with backend.open_run("run-after-a-crash"):
            assert not dead.exists()
            assert live.read_file("work.txt") == b"in use" and stranger.exists()
    finally:
        live.close()


def test_open_sandbox_local_is_explicit():
    sb = open_sandbox(SandboxSpec(image="x"), SandboxSettings(backend="local"))
    try:
        assert isinstance(sb, LocalSandbox)
    finally:
        sb.close()


# --------------------------------------------------------------------------- output cap


def test_output_cap_counts_bytes():
    cap = OutputCap(5)
    cap.feed("héllo wörld".encode())
    text, truncated = cap.result()
    assert truncated and text == "héllo\n[output truncated: 7 more bytes]"
    cap = OutputCap(100)
    cap.feed(b"fine\xff")
    assert cap.result() == ("fine\ufffd", False)
    cap = OutputCap(3)
    for _ in range(10_000):
        cap.feed(b"y\n" * 100)
    text, truncated = cap.result()
    assert text == "y\ny\n[output truncated: 1999997 more bytes]" and truncated
    assert not cap.flooded


def test_offline_image_says_how_to_get_busybox(monkeypatch):
    from hermes.sandbox import busybox as img

    monkeypatch.setattr(img, "_is_static_elf", lambda path: False)
    with pytest.raises(SandboxError, match="apt-get install busybox-static"):
        img.find_static_busybox()
