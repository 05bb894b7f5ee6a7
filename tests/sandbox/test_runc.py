"""The runc backend's own behaviour: what the tests both backends run (test_sandbox.py's
both_backends, the abuse suite) do not show. Real runc, real cgroups, real processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from hermes.sandbox import get_backend
from hermes.sandbox.base import SandboxError, SandboxSettings, SandboxSpec, WeakerSandbox
from tests.helpers import until, within

RUN_ID = f"pytest-runc-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def backend(sandbox_image):
    runc = get_backend(SandboxSettings(backend="runc", command_timeout=20, output_limit=2000))
    if not runc.available():
        pytest.skip("the runc backend needs runc and root")
    yield runc
    runc.drain(60)
    left = [f.name for f in runc.leftovers(RUN_ID) if f.run.startswith(RUN_ID)]
    runc.cleanup(RUN_ID, include_live=True)
    assert left == [], f"tests left runc sandboxes behind: {left}"


@pytest.fixture
def sb(backend, sandbox_image, request):
    box = backend.open(SandboxSpec(image=sandbox_image, run_id=RUN_ID, prompt_id=request.node.name))
    yield box
    box.close()


def traces(name: str) -> list[str]:
    """What of a sandbox is still on the host: runc's state, its cgroups, its folder."""
    from hermes.sandbox.runc import state

    found = [str(p) for p in (state.RUNC_ROOT / name, state.BOXES / name) if p.exists()]
    return found + [str(d) for d in state.cgroup_dirs(name)]


def test_close_leaves_nothing_on_the_host(backend, sandbox_image):
    box = backend.open(SandboxSpec(image=sandbox_image, run_id=RUN_ID, prompt_id="close"))
    assert box.exec("echo in").output == "in\n"
    assert traces(box.name)  # it was there
    box.close()
    box.close()
    assert traces(box.name) == []
    with pytest.raises(SandboxError):
        box.exec("true")


def test_close_ends_every_process_of_the_sandbox_detached_ones_too(backend, sandbox_image):
    # removal is done by hand (the cgroup's processes killed, its folders removed), not by runc delete
    marks = [f"900.{uuid.uuid4().int % 10**9:09d}" for _ in range(3)]

    def marked() -> list[str]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            found += [pid] if any(m in cmd for m in marks) else []
        return found

    box = backend.open(SandboxSpec(image=sandbox_image, run_id=RUN_ID, prompt_id="procs"))
    try:
        box.exec(f"sleep {marks[0]} & setsid sleep {marks[1]} </dev/null >/dev/null 2>&1 & "
                 f"(trap '' TERM HUP INT; sleep {marks[2]}) </dev/null >/dev/null 2>&1 & echo started", timeout=10)
        until(lambda: len(marked()) == 3, timeout=10, what="the sandbox's three sleeps seen on the host")
    finally:
        box.close()
    assert traces(box.name) == []
    assert marked() == []


def test_kill_all_processes_leaves_the_sandbox_working(sb):
    # The channel is the sandbox's PID 1, which kill -9 -1 skips: the command dies, the sandbox stays.
    r = within(60, sb.exec, "sleep 300 & kill -9 -1; sleep 120; echo never")
    assert r.exit_code == 137 and "never" not in r.output
    assert within(60, sb.exec, "echo hello").output == "hello\n"
    # what was left of the command (its shell, spared as the killer) is killed from the host; a
    # SIGKILL lands a moment later (over 10 s once on a loaded CI machine), long before its own
    # 120 s would end it
    until(lambda: "kill -9 -1" not in sb.exec("ps -o args").output, "the rest of the command to be killed", timeout=40)


def test_a_concurrent_call_gets_an_exec_of_its_own(sb):
    results = {}
    slow = threading.Thread(target=lambda: results.update(slow=sb.exec("sleep 2; echo slow")))
    slow.start()
    until(lambda: "sleep 2" in sb.exec("ps -o args").output, "the slow command to start", timeout=30)
    results["quick"] = sb.exec("echo quick")
    sb.write_file("side.txt", b"beside")
    slow.join(60)
    assert results["quick"].output == "quick\n" and results["slow"].output == "slow\n", results
    assert sb.read_file("side.txt") == b"beside"


def test_a_stolen_request_stream_costs_one_call_at_most(sb):
    # A background job reading PID 1's stdin can swallow a request: that call ends at its time
    # limit, the channel is given up, and every later call gets a runc exec of its own.
    sb.exec("(cat /proc/1/fd/0 >/dev/null 2>&1 &); echo thief-started")
    for i in range(10):
        r = within(60, sb.exec, f"echo try{i}", timeout=2)
        if r.timed_out:
            break
        assert (r.output, r.exit_code) == (f"try{i}\n", 0)
    for i in range(3):
        assert within(60, sb.exec, f"echo after{i}").output == f"after{i}\n"
    sb.write_file("f", b"still")
    assert sb.read_file("f") == b"still"


def test_cgroups_docker_socket_and_host_root_are_out_of_reach(sb):
    r = sb.exec("echo 999999999999 > /sys/fs/cgroup/memory/memory.limit_in_bytes || "
                "echo 999999999999 > /sys/fs/cgroup/memory.max")
    assert r.exit_code != 0 and "Read-only file system" in r.output, r.output
    assert sb.exec("ls /var/run/docker.sock /run/docker.sock").exit_code != 0
    assert sb.exec("ls /run/hermes-runc /var/cache/hermes-runc").exit_code != 0
    assert sb.exec("cat /proc/kcore | head -c 1; echo rc=$?").output.strip().endswith("rc=0")  # masked: empty
    assert sb.exec("grep Seccomp: /proc/self/status").output.split() == ["Seccomp:", "2"]


def _crash(image: str, run: str, code: str = "", then: str = "") -> list[str]:
    """A process that opens two runc sandboxes and dies without closing them (after `then`)."""
    script = textwrap.dedent(f"""
        import os, time
        from hermes.sandbox import get_backend, base
        from hermes.sandbox.base import SandboxSettings, SandboxSpec
        from hermes.sandbox.runc import reaper, state
        {code}
        b = get_backend(SandboxSettings(backend="runc"))
        boxes = [b.open(SandboxSpec(image={image!r}, run_id={run!r}, lifetime=LIFETIME)) for _ in range(2)]
        print(" ".join(x.name for x in boxes), flush=True)
        {then}
        os._exit(0)
    """)
    return subprocess.run([sys.executable, "-c", script], check=True, timeout=120, capture_output=True,
                          text=True).stdout.split()


def test_a_killed_owner_s_reaper_removes_its_sandboxes_at_once(sandbox_image):
    names = _crash(sandbox_image, f"{RUN_ID}-killed", "LIFETIME = None")
    # no deadline, no later run: the owner's reaper saw its pipe close and removed them
    until(lambda: all(traces(n) == [] for n in names), "the reaper to remove the sandboxes", timeout=30)


def test_without_its_reaper_a_dead_owner_s_sandboxes_stop_and_the_next_run_removes_them(backend, sandbox_image):
    # the reaper killed first (as a kill of every process would): the next run's sweep is the way left
    names = _crash(sandbox_image, f"{RUN_ID}-crashed", "LIFETIME = None",
                   "r = reaper.reaper(str(state.RUNC_ROOT), str(state.BOXES)); r.proc.kill(); r.proc.wait()")
    # its end of the channel's pipes closed: each sandbox's PID 1 read end of file and exited
    from hermes.sandbox.runc import state

    until(lambda: all(b'"status": "stopped"' in state.runc("state", n).stdout.replace(b'":"', b'": "')
                      for n in names), "the dead owner's sandboxes to stop", timeout=30)
    dead = {f.name: f.alive for f in backend.leftovers(f"{RUN_ID}-another")}
    assert {n: dead.get(n) for n in names} == {n: False for n in names}
    live = backend.open(SandboxSpec(image=sandbox_image, run_id=f"{RUN_ID}-live"))
    try:
        run = backend.open_run(f"{RUN_ID}-another")  # a run of another name sweeps them at its start
        run.close()
        assert [traces(n) for n in names] == [[], []]
        assert live.exec("echo alive").output == "alive\n"  # a live owner's sandbox is kept
    finally:
        live.close()


def test_a_sandbox_past_its_lifetime_is_removed_while_its_owner_lives(sandbox_image, tmp_path):
    done = tmp_path / "gone"
    # the owner waits, alive, until its reaper has removed both sandboxes (lifetime 1 s + margin 1 s)
    names = _crash(sandbox_image, f"{RUN_ID}-lifetime", "base.LIFETIME_MARGIN = 1.0; LIFETIME = 1.0", textwrap.dedent(f"""
        t = time.monotonic() + 60
        while time.monotonic() < t and any((state.BOXES / x.name).exists() or (state.RUNC_ROOT / x.name).exists()
                                           for x in boxes):
            time.sleep(0.2)
        open({str(done)!r}, "w").write(str(reaper.reaper("", "").proc.poll()))
    """).replace("\n", "\n        "))
    assert done.read_text() == "None"  # the reaper removed them and was still running: its owner lived
    assert [traces(n) for n in names] == [[], []]


def test_sigterm_removes_the_run_s_sandboxes_before_the_process_ends(sandbox_image, tmp_path):
    run = f"{RUN_ID}-term"
    ready = tmp_path / "names"
    script = textwrap.dedent(f"""
        import time
        from hermes.sandbox import get_backend
        from hermes.sandbox.base import SandboxSettings, SandboxSpec
        b = get_backend(SandboxSettings(backend="runc"))
        r = b.open_run({run!r})
        boxes = [b.open(SandboxSpec(image={sandbox_image!r}, run_id={run!r})) for _ in range(2)]
        open({str(ready)!r}, "w").write(" ".join(x.name for x in boxes))
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        until(lambda: ready.exists() and ready.read_text(), "the sandboxes to open", timeout=60)
        names = ready.read_text().split()
        assert all(traces(n) for n in names)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) != 0
    finally:
        proc.kill()
        proc.wait()
    assert [traces(n) for n in names] == [[], []]


def test_a_limit_that_would_not_hold_refuses_the_run(sandbox_image):
    weak = SandboxSettings(backend="runc", image=sandbox_image, memory="0")  # "0": no memory limit at all
    with pytest.raises(WeakerSandbox, match="memory"):
        get_backend(weak).check_limits(RUN_ID)
    accepted = get_backend(weak.model_copy(update={"allow_weaker_sandbox": True})).check_limits(RUN_ID)
    assert any("memory" in p for p in accepted)
    assert get_backend(SandboxSettings(backend="runc", image=sandbox_image)).check_limits(RUN_ID) == []


def test_the_image_root_is_unpacked_once_and_shared_read_only(backend, sandbox_image):
    from hermes.sandbox.runc.rootfs import image_root

    root = image_root(sandbox_image, backend.settings)
    assert (root.rootfs / "bin").exists() and root.id.startswith("sha256:")
    assert str(root.rootfs).startswith(str(Path("/var/cache/hermes-runc"))) or os.environ.get("HERMES_RUNC_CACHE")


def test_output_still_in_the_pipe_when_stderr_ends_is_read():
    """A plain exec's wrapper writes its end marker on stdout, then exits, closing stderr: the
    reader may see stderr's end first, with the marker still unread (under load it did, and a
    command's output came back empty)."""
    import os
    import time

    from hermes.sandbox.runc.pipes import PipeFrames

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    frames = PipeFrames(out_r, err_r)
    os.close(err_w)  # stderr ends first, then stdout's data arrives: the order the reader sees them in
    os.write(out_w, b"quick\n\nNONCE 0 0\n")
    got = []
    while (frame := frames.next(time.monotonic() + 10)) is not None:
        got.append(frame)
    frames.close()
    os.close(out_w)
    assert got == [(1, b"quick\n\nNONCE 0 0\n")]


I386_GETPID = """
import ctypes, mmap, os
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3]))  # mov eax, 20 (i386 getpid); int 0x80; ret
call = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
print("native", os.getpid(), flush=True)
print("i386", call(), flush=True)
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the 32-bit ABI probed is x86's")
def test_only_the_native_syscall_abi_is_allowed(backend, default_image):
    """The engine's seccomp profile on the native ABI only: a 32-bit syscall kills its caller."""
    box = backend.open(SandboxSpec(image=default_image, run_id=RUN_ID, prompt_id="abi"))
    try:
        box.write_file("/tmp/abi.py", I386_GETPID.encode())
        r = box.exec("python3 /tmp/abi.py; echo rc=$?")
        assert r.output.startswith("native ") and "i386" not in r.output, r.output
        assert r.output.endswith("rc=159\n"), r.output  # 128 + SIGSYS
    finally:
        box.close()


def test_waiting_for_runc_wakes_at_its_exit_and_bounds_a_hang():
    from hermes.sandbox.runc.sandbox import wait_exit

    assert wait_exit(subprocess.Popen(["sh", "-c", "exit 3"]), 10) == 3
    hung = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            wait_exit(hung, 0.3)
        assert hung.poll() is None
    finally:
        hung.kill()
        hung.wait()
