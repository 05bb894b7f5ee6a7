"""The docker sandbox's command channel, background removal and engine gate, on the real engine.

One exec per container serves every command and file operation; what a command prints, reads
or kills must never break the framing, hang the caller, or leak into a later call's result.
No timing assertions: "does not hang" is a generous deadline on a thread, never a speed claim.
"""
from __future__ import annotations

import threading
import time
import uuid

import pytest

from hermes.sandbox import cleanup, drain_removals, open_sandbox
from hermes.sandbox.base import EngineTimeout, SandboxError, SandboxSettings, SandboxSpec
from tests.conftest import containers_of
from tests.helpers import until_named, within

pytestmark = pytest.mark.docker
RUN = f"pytest-chan-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def image(sandbox_image, docker_engine):
    yield sandbox_image
    drain_removals(120)
    left = containers_of(docker_engine, RUN)
    cleanup(RUN, include_live=True)
    assert not left, f"tests left containers behind: {[c.name for c in left]}"


@pytest.fixture
def make(image, request):
    made = []

    def _make(img: str | None = None, **overrides):
        s = SandboxSettings(command_timeout=30, output_limit=2000).model_copy(update=overrides)
        sb = open_sandbox(SandboxSpec(image=img or image, run_id=RUN, prompt_id=request.node.name[:40]), s)
        made.append(sb)
        return sb

    yield _make
    for sb in made:
        sb.close()


@pytest.fixture
def sb(make):
    return make()


def execs_of(client, cid: str, since: float) -> list[str]:
    """The commands the engine was asked to exec in container `cid` since `since` (its events)."""
    events = client.api.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                               filters={"container": cid, "event": "exec_create"})
    return [e["Action"].split(":", 1)[1].strip() for e in events if e["timeNano"] >= since * 1e9]


def gone(client, cid: str) -> bool:
    return not client.api.containers(all=True, filters={"id": cid})



# --------------------------------------------------------------------------- one exec


def test_many_tool_calls_use_one_exec(sb, docker_engine):
    since = time.time()
    for i in range(10):
        r = sb.exec(f"echo out{i}; echo err{i} >&2; exit {i % 3}")
        assert (r.output, r.exit_code) == (f"out{i}\nerr{i}\n", i % 3)
        sb.write_file(f"notes/{i}.txt", f"note {i}\n".encode())
        assert sb.read_file(f"notes/{i}.txt") == f"note {i}\n".encode()
    with pytest.raises(FileNotFoundError):
        sb.read_file("missing")
    with pytest.raises(IsADirectoryError):
        sb.write_file("notes", b"x")
    assert sb.exec("pwd", cwd="/tmp").output == "/tmp\n"
    execs = execs_of(docker_engine, sb.container_id, since)
    assert len(execs) == 1, execs


def test_binary_files_round_trip_over_the_channel(sb, docker_engine):
    since = time.time()
    nasty = bytes(range(256)) * 9 + b"\n~deadbeefdeadbeef 0\n\ndeadbeefdeadbeef s\n\x00\xff"
    sb.write_file("/tmp/bin/x.dat", nasty)
    assert sb.read_file("/tmp/bin/x.dat") == nasty
    big = bytes(reversed(range(256))) * 8192  # 2 MiB
    sb.write_file("big.bin", big)
    assert sb.read_file("big.bin") == big
    sb.write_file("empty", b"")
    assert sb.read_file("empty") == b""
    odd = "we ird\nname $(touch pwned) '\"`;.txt"
    sb.write_file(odd, b"odd")
    assert sb.read_file(odd) == b"odd"
    assert sb.exec("ls pwned 2>/dev/null; echo checked").output == "checked\n"
    assert len(execs_of(docker_engine, sb.container_id, since)) == 1


# --------------------------------------------------------------------------- hostile commands


HOSTILE = [
    "printf '\\n%s 0 0\\n' 0123456789abcdef; printf '\\n~0123456789abcdef 0\\n' >&2; echo still",
    "printf '~hermes-channel 1\\n'; printf '\\n0 s\\n\\n0 0 0\\n'",
    "cat; read x; echo \"stdin:[$x]\"",
    "exec >&-; exec 2>&-; sleep 0.2",
    "echo partial; kill -9 $PPID; echo never",
    "exec 3>&-; exec 4<&-; echo fds-closed >&2",
    "head -c 100000 /dev/urandom",
    "echo x | base64; printf 'x 1 2 3\\n'",
]


@pytest.mark.parametrize("command", HOSTILE)
def test_hostile_output_does_not_break_later_calls(sb, command):
    within(60, sb.exec, command, timeout=10)
    for i in range(3):
        assert within(60, sb.exec, f"echo fine{i}").output == f"fine{i}\n"
    sb.write_file("after.txt", b"ok")
    assert sb.read_file("after.txt") == b"ok"


def test_commands_read_no_stdin(sb):
    r = sb.exec("cat; read x; echo \"got[$x]\"")
    assert (r.output, r.exit_code) == ("got[]\n", 0)


def test_killing_the_parent_is_reported_like_any_sigkill(sb):
    r = sb.exec("echo partial; kill -9 $PPID; sleep 0.2; echo late")
    assert r.exit_code == 137 and r.output.startswith("partial") and "SIGKILL" in r.output
    assert sb.exec("echo next").output == "next\n"


def test_killing_the_channel_shell_opens_a_new_one(sb, docker_engine):
    assert sb.exec("echo warm").output == "warm\n"
    since = time.time()
    # The channel's shell is the exec with no parent inside the container (its parent is the engine's shim).
    within(60, sb.exec, "kill -9 $(ps -o pid,ppid,args | awk '$2 == 0 && /hermes-channel/ {print $1}')")
    for i in range(3):
        assert within(60, sb.exec, f"echo again{i}").output == f"again{i}\n"
    assert sb.read_file("/etc/passwd").startswith(b"root:")
    assert len(execs_of(docker_engine, sb.container_id, since)) == 1  # one new channel, not one per call


def test_kill_all_processes_stops_the_sandbox_without_hanging(sb):
    # kill -9 -1 as the sandbox user also kills the container's keep-alive process: the container
    # stops (with or without a channel). The call ends, saying so, and so do later calls.
    with pytest.raises(SandboxError, match="stopped"):
        within(60, sb.exec, "kill -9 -1; sleep 1")
    with pytest.raises(SandboxError, match="stopped|gone|not running"):
        within(60, sb.exec, "echo hello")


def test_stealing_the_request_stream_costs_one_call_at_most(sb):
    # A background job reading the channel shell's own stdin races it for requests. A request it
    # swallows ends at that call's time limit and the channel is replaced: later calls all work.
    sb.exec("pid=$(ps -o pid,ppid,args | awk '$2 == 0 && /hermes-channel/ {print $1}'); "
            "(cat /proc/$pid/fd/0 >/dev/null 2>&1 &) ; echo thief-started")
    for i in range(10):
        r = within(60, sb.exec, f"echo try{i}", timeout=2)
        if r.timed_out:
            assert r.exit_code == -1
            break
        assert (r.output, r.exit_code) == (f"try{i}\n", 0)
    for i in range(3):
        assert within(60, sb.exec, f"echo after{i}").output == f"after{i}\n"
    sb.write_file("still.txt", b"ok")
    assert sb.read_file("still.txt") == b"ok"


def test_time_limit_kills_the_whole_group_over_the_channel(sb, docker_engine):
    since = time.time()
    r = sb.exec("sleep 101 & sleep 102 & echo started; sleep 103", timeout=1)
    assert r.timed_out and r.exit_code == -1 and "started" in r.output
    assert "sleep 10" not in sb.exec("ps -o args | grep -v grep").output
    assert len(execs_of(docker_engine, sb.container_id, since)) == 1


def test_output_cap_and_flood_over_the_channel(sb):
    r = sb.exec("seq 1 20000")
    full = "".join(f"{i}\n" for i in range(1, 20001))
    assert r.truncated and r.output == full[:2000] + f"\n[output truncated: {len(full) - 2000} more bytes]"
    r = within(120, sb.exec, "yes hermes", timeout=60)
    assert r.truncated and r.exit_code == -1 and "[command killed" in r.output
    assert sb.exec("echo calm").output == "calm\n"


@pytest.mark.parametrize("which", ["mini", "default"])
def test_a_flood_is_killed_by_the_output_cap_on_both_images(which, make, request):
    # The kill is the image's own: procps's `kill` (the default image) took "-PGID" for an option
    # and killed nothing, so a flood ran on to its time limit there
    img = request.getfixturevalue("default_image") if which == "default" else None
    r = within(120, make(img).exec, "yes hermes", timeout=100)
    assert r.truncated and r.exit_code == -1 and not r.timed_out, r
    assert "[command killed: it kept writing output" in r.output, r.output[-300:]


def test_background_output_does_not_leak_into_later_results(sb, docker_engine):
    sb.exec("(sleep 0.3; echo LATE; echo LATE >&2; touch /tmp/late-done) & echo launched")
    # Waited for outside the channel: output printed while a later command runs shows in that
    # command's result, as in a terminal (channel.py, STALE_LIMIT); what is printed between two
    # commands must show in neither.
    container = docker_engine.containers.get(sb.container_id)
    until_named("the late output to be written",
               lambda: container.exec_run(["test", "-e", "/tmp/late-done"]).exit_code == 0)
    assert sb.exec("echo next").output == "next\n"
    assert sb.exec("echo again").output == "again\n"
    sb.write_file("f", b"clean")
    # A job that writes for ever once its command has ended. It starts a moment later: a flood
    # that began before the command's end marker was read could pass the output cap and be
    # killed with the command (under a loaded suite it was, and never showed up in `top`).
    sb.exec("(sleep 0.5; exec yes noise) & echo flooding")
    until_named("the flood to run", lambda: any("yes noise" in " ".join(p)
                                               for p in docker_engine.api.top(sb.container_id)["Processes"]))
    assert sb.read_file("f") == b"clean"
    assert sb.exec("echo quiet").output.endswith("quiet\n")
    assert sb.exec("echo quieter").output == "quieter\n"  # a new channel: the flood keeps the old one


def test_a_concurrent_call_does_not_wait_for_a_long_command(sb, docker_engine):
    # The long command cannot end before the test lets it (it waits for /tmp/go): a quick call
    # that waited for it would hang, and the bound below would say so.
    done: list[str] = []
    slow = threading.Thread(target=lambda: done.append(
        sb.exec("while [ ! -e /tmp/go ]; do sleep 0.05; done; echo slow", timeout=120).output.strip()))
    slow.start()
    until_named("the long command to run", lambda: any("/tmp/go" in " ".join(p)
                                                      for p in docker_engine.api.top(sb.container_id)["Processes"]))
    done.append(within(60, sb.exec, "echo quick").output.strip())
    within(60, sb.write_file, "/tmp/go", b"")
    slow.join(60)
    assert done == ["quick", "slow"]


def test_closing_ends_the_commands_waited_on_in_the_channel_and_in_an_exec_of_their_own(make, docker_engine):
    # What a stop relies on (an API client that left, a prompt past its time): the close, from
    # another thread, ends every command a tool call is waiting on, whichever stream it is on.
    sb = make(command_timeout=900)
    ended: dict[str, object] = {}

    def hold(name: str) -> None:
        try:
            ended[name] = sb.exec(f"while [ ! -e /tmp/{name} ]; do sleep 0.05; done; echo {name}").output
        except SandboxError as e:
            ended[name] = e

    first = threading.Thread(target=hold, args=("channel",))
    first.start()
    until_named("the channel's command", lambda: "/tmp/channel" in str(docker_engine.api.top(sb.container_id)["Processes"]))
    second = threading.Thread(target=hold, args=("own",))  # the channel is busy: an exec of its own
    second.start()
    until_named("the second command", lambda: "/tmp/own" in str(docker_engine.api.top(sb.container_id)["Processes"]))
    sb.close(wait=False)
    first.join(60)
    second.join(60)
    assert not first.is_alive() and not second.is_alive(), "a command outlived its sandbox's close"
    assert "channel\n" != ended["channel"] and "own\n" != ended["own"]  # neither was let through
    assert drain_removals(120)


def test_a_closed_sandbox_ends_a_command_wait_even_where_its_socket_was_not_shut(make, docker_engine):
    # The API's stop of a client that left was once in a few full suites seen to close the sandbox
    # while its command's read waited on for ever. Whatever kept the socket from waking, the read
    # asks every second whether its sandbox is still open: here the sandbox is marked closed with
    # nothing else done (no socket shut, the container left running), and the wait must end.
    sb = make(command_timeout=900)
    ended: list[object] = []

    def hold() -> None:
        try:
            ended.append(sb.exec("while [ ! -e /tmp/never ]; do sleep 0.05; done; echo through").output)
        except SandboxError as e:
            ended.append(e)

    waiter = threading.Thread(target=hold)
    waiter.start()
    until_named("the command", lambda: "/tmp/never" in str(docker_engine.api.top(sb.container_id)["Processes"]))
    sb._closed = True  # what close() does first, and the only part of it done here
    waiter.join(30)
    assert not waiter.is_alive(), "the command's wait outlived its sandbox's close"
    assert ended and ended[0] != "through\n"
    sb._closed = False
    sb.close()


def test_a_shell_that_cannot_serve_a_channel_falls_back_to_an_exec_per_call(sb, docker_engine, monkeypatch):
    # Stands in for an image whose shell lacks what the channel needs (base64, head): its channel
    # shell ends at once. Every call then gets an exec of its own, as before the channel.
    from hermes.sandbox.docker import channel

    monkeypatch.setattr(channel, "SERVER", "echo 'base64: not found' >&2; exit 127\n")
    since = time.time()
    assert sb.exec("echo works").output == "works\n"
    sb.write_file("a.txt", b"\x00data\xff")
    assert sb.read_file("a.txt") == b"\x00data\xff"
    with pytest.raises(FileNotFoundError):
        sb.read_file("missing")
    assert sb.exec("sleep 100", timeout=1).timed_out
    execs = execs_of(docker_engine, sb.container_id, since)
    assert len([e for e in execs if "hermes-channel" in e]) == 1  # tried once, not on every call
    assert len(execs) == 6, execs


# --------------------------------------------------------------------------- removal


def test_close_without_waiting_removes_the_container_soon_after(make, docker_engine):
    sb = make()
    sb.exec("true")
    cid = sb.container_id
    sb.close(wait=False)
    with pytest.raises(SandboxError):
        sb.exec("true")
    assert drain_removals(120)
    assert gone(docker_engine, cid)


def test_a_prompts_lazy_sandbox_leaves_removal_to_the_background(image, docker_engine):
    from hermes.sandbox.lazy import LazySandbox

    spec = SandboxSpec(image=image, run_id=RUN, prompt_id="lazy-bg")
    box = LazySandbox(lambda: open_sandbox(spec, SandboxSettings()), 30, prefetch=True, remove_in_background=True)
    assert box.exec("echo hi").output == "hi\n"
    cid = box._sandbox.container_id
    box.close()
    until_named("the closed sandbox's container to be removed", lambda: gone(docker_engine, cid))
    assert drain_removals(60)


def test_exit_removes_containers_still_queued(image, docker_engine):
    import subprocess
    import sys

    run = f"{RUN}-exit"
    code = ("from hermes.sandbox import open_sandbox\nfrom hermes.sandbox.base import SandboxSettings, SandboxSpec\n"
            f"boxes = [open_sandbox(SandboxSpec(image={image!r}, run_id={run!r}), SandboxSettings()) for _ in range(3)]\n"
            "boxes[0].close(wait=False); boxes[1].close(wait=False)\n")  # the third is never closed
    subprocess.run([sys.executable, "-c", code], check=True, timeout=180)
    assert containers_of(docker_engine, run) == []


# --------------------------------------------------------------------------- the engine gate


def test_engine_calls_in_flight_are_bounded(image, monkeypatch):
    from docker.api.client import APIClient

    lock, state = threading.Condition(), {"now": 0, "peak": 0, "calls": 0}

    def counted(name):
        real = getattr(APIClient, name)

        def call(self, *a, **kw):
            with lock:
                state["now"] += 1
                state["calls"] += 1
                state["peak"] = max(state["peak"], state["now"])
                lock.notify_all()
                # Hold the call until the gate is full (a second call in flight), so a gate that let a
                # third through would show; the bound is for the last call, which has no partner.
                lock.wait_for(lambda: state["now"] >= 2, timeout=0.5)
            try:
                return real(self, *a, **kw)
            finally:
                with lock:
                    state["now"] -= 1
        return call

    for name in ("create_container", "start", "remove_container"):
        monkeypatch.setattr(APIClient, name, counted(name))
    settings = SandboxSettings(engine_concurrency=2)

    def life(i):
        sb = open_sandbox(SandboxSpec(image=image, run_id=RUN, prompt_id=f"gate-{i}"), settings)
        sb.close()

    threads = [threading.Thread(target=life, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert state["calls"] == 24 and 1 <= state["peak"] <= 2, state
    monkeypatch.undo()
    open_sandbox(SandboxSpec(image=image, run_id=RUN, prompt_id="gate-reset"), SandboxSettings()).close()


def test_an_engine_that_does_not_answer_fails_the_prompt_at_once(image, docker_engine):
    from hermes.sandbox.lazy import LazySandbox

    made = []

    def factory():
        made.append(1)
        return open_sandbox(SandboxSpec(image=image, run_id=RUN, prompt_id="slow-engine"),
                            SandboxSettings(engine_timeout=0.001))

    box = LazySandbox(factory, 30)
    with pytest.raises(EngineTimeout, match="did not answer"):
        box.exec("true")
    with pytest.raises(EngineTimeout):  # not asked again: it would only wait as long again
        box.exec("true")
    assert len(made) == 1
    box.close()
    # The create that timed out here may still make its container, moments later: sweep until none shows.
    deadline = time.monotonic() + 10
    while not cleanup(RUN, include_live=True) and time.monotonic() < deadline:
        time.sleep(0.5)
