"""Containers never outlive their run: SIGKILL then resume, SIGINT/SIGTERM, `sandbox cleanup`,
prefetch, and refusing a run whose limits the engine would not apply.

Real runs are real processes (`python batch_runner.py`) against a real Prefect server and the
bundled model server on loopback; containers are real, on the real engine. The engine may be
shared: these tests only ever remove containers of their own runs.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from hermes.sandbox import lifecycle
from hermes.sandbox.base import LABEL_OWNER, SandboxError, SandboxSettings, SandboxSpec
from tests.conftest import containers_of
from tests.helpers import until_named, on_host, own_host, script, unpullable_image

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.docker


def uniq(name: str) -> str:
    return f"{name}-{secrets.token_hex(3)}"


SLEEPER = script({"reasoning": "Wait for it.", "tool_calls": [{"name": "terminal", "arguments": {"command": "sleep 60"}}]},
                 {"reasoning": "Waited.", "content": "Done."})



def sleeping_in(client, containers) -> bool:
    """Every container is inside its prompt's `sleep 60` tool call."""
    try:
        return all(any("sleep 60" in " ".join(p) for p in client.api.top(c.id)["Processes"]) for c in containers)
    except Exception:  # noqa: BLE001 - a container still starting
        return False


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    from tests.prefect_server import running_prefect_server

    with running_prefect_server(tmp_path_factory.mktemp("prefect")) as server:
        yield server


@pytest.fixture(scope="module")
def llm():
    from mockllm import MockLLM

    with MockLLM() as server:
        yield server


class Run:
    """`python batch_runner.py ...` in a session of its own, its output kept in files (under
    `host`'s name when given: own_host)."""

    def __init__(self, tmp: Path, name: str, env: dict, llm_url: str, *extra: str, host: str | None = None):
        self.name, self.tmp = name, tmp
        self.log = tmp / f"{name}-{secrets.token_hex(2)}.log"
        cmd = on_host(host, [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={tmp / 'prompts.jsonl'}",
                             "--batch_size=2", f"--run_name={name}", f"--base_url={llm_url}", "--model=mock-model",
                             "--num_workers=4", *extra])
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def wait(self, timeout: float = 300) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"run {self.name} did not end:\n{self.output()[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def trajectories(self) -> list[dict]:
        path = self.tmp / "data" / self.name / "trajectories.jsonl"
        return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


@pytest.fixture
def start(tmp_path, prefect_api, llm, sandbox_image, docker_engine):
    """start(run_name, *flags) -> Run over four sleeping prompts; all are ended and their containers removed after."""
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"Sleeper {i}. {SLEEPER}"}) + "\n"
                                                     for i in range(4)))
    runs: list[Run] = []

    def _start(name: str, *flags: str, host: str | None = None) -> Run:
        runs.append(Run(tmp_path, name, prefect_api.env, llm.base_url, *flags, host=host))
        return runs[-1]

    yield _start
    for run in runs:
        run.kill()
    for name in {r.name for r in runs}:
        for c in containers_of(docker_engine, name):
            c.remove(force=True)


# --------------------------------------------------------------------------- killed runs


def killed_mid_prompt(start, docker_engine, name: str, host: str) -> set[str]:
    """Start run `name` under `host`, SIGKILL it while its four containers are in their tool
    call; the ids of the containers it left."""
    run = start(name, "--sandbox_command_timeout=600", host=host)
    live = until_named("four containers inside their tool call",
                      lambda: (cs := containers_of(docker_engine, name)) and len(cs) >= 4 and sleeping_in(docker_engine, cs) and cs)
    os.kill(run.proc.pid, signal.SIGKILL)
    run.proc.wait()
    dead = {c.id for c in containers_of(docker_engine, name)}
    assert dead >= {c.id for c in live}, "a SIGKILLed process cannot remove its containers: they must still be here"
    return dead


def test_sigkill_leaves_containers_that_the_resumed_run_removes(start, docker_engine):
    name, host = uniq("killed"), own_host()
    dead = killed_mid_prompt(start, docker_engine, name, host)

    # The next invocation of the same run finds them (their owner is dead) and removes them first.
    resumed = start(name, "--resume", "--sandbox_command_timeout=1", host=host)
    assert resumed.wait() == 0, resumed.output()[-3000:]
    assert "left behind by an earlier, dead run" in resumed.output()
    assert not dead & {c.id for c in containers_of(docker_engine, name)}
    assert containers_of(docker_engine, name) == []
    entries = resumed.trajectories()
    assert len(entries) == 4 and all(e["completed"] for e in entries)


def test_a_killed_run_s_containers_go_with_the_next_run_of_another_name(start, docker_engine):
    """A scheduled run gets a new stamped name each time: a killed one is never resumed, so the
    next run on the host, whatever its name, removes what it left (issue 34)."""
    name, host = uniq("killed"), own_host()
    dead = killed_mid_prompt(start, docker_engine, name, host)

    other = start(uniq("next"), "--sandbox_command_timeout=1", host=host)
    assert other.wait() == 0, other.output()[-3000:]
    assert f"left behind by an earlier, dead run ('{name}')" in other.output()
    assert not dead & {c.id for c in containers_of(docker_engine, name)}
    assert containers_of(docker_engine, name) == []  # 0 containers of the killed run
    assert len(other.trajectories()) == 4


def test_a_sandbox_whose_owner_was_killed_ends_by_itself(sandbox_image, docker_engine):
    """Nobody runs after the killed owner: its sandbox's main process ends at the spec's lifetime
    plus the margin, and the engine removes the container (a short deadline here: lifetime 2 s,
    the margin set to 3 s in that process)."""
    run = uniq("orphan")
    code = ("import os, signal\n"
            "import hermes.sandbox.base as base\n"
            "from hermes.sandbox import open_sandbox\n"
            "from hermes.sandbox.base import SandboxSettings, SandboxSpec\n"
            "base.LIFETIME_MARGIN = 3.0\n"
            f"sb = open_sandbox(SandboxSpec(image={sandbox_image!r}, run_id={run!r}, prompt_id='0', lifetime=2), SandboxSettings())\n"
            "print(sb.container_id, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    host = own_host()  # no other test's run may sweep it first: it must go by itself
    done = subprocess.run(on_host(host, [sys.executable, "-c", code]), cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    cid = done.stdout.split()[-1]
    try:
        info = docker_engine.api.inspect_container(cid)
        assert info["Config"]["Cmd"] == ["5"] and info["HostConfig"]["AutoRemove"]  # sleep 2 + 3, not 68 years
        assert info["Config"]["Labels"][LABEL_OWNER].startswith(f"{host}:")
    except docker.errors.NotFound:
        pass  # already gone by itself
    until_named("the orphan's container to be gone", lambda: containers_of(docker_engine, run) == [], timeout=60)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_run_removes_its_containers_before_it_exits(start, docker_engine, signum):
    name = uniq(signal.Signals(signum).name.lower())
    run = start(name, "--sandbox_command_timeout=600")
    until_named("four containers inside their tool call",
               lambda: (cs := containers_of(docker_engine, name)) and len(cs) >= 4 and sleeping_in(docker_engine, cs))
    os.killpg(run.proc.pid, signum)  # as a terminal's Ctrl-C, or a supervisor's stop, reaches the process group
    code = run.wait(timeout=120)
    assert containers_of(docker_engine, name) == [], run.output()[-3000:]
    assert code == 128 + signum, run.output()[-3000:]  # 130 for SIGINT, 143 for SIGTERM: not a traceback's 1
    assert "removing its containers" in run.output()
    # Interrupted prompts are not recorded as done: a resume runs them again.
    journal = [l for p in (run.tmp / "data" / name).glob("batch_*.jsonl") for l in p.read_text().splitlines()]
    assert not [l for l in journal if json.loads(l)["hermes"]["status"] == "completed"]


# --------------------------------------------------------------------------- sandbox cleanup


def make_dead_containers(run: str, count: int, image: str, host: str) -> None:
    """Make `count` sandboxes for `run` in another process on `host`, which then dies without closing them."""
    code = ("import os, sys\n"
            "from hermes.sandbox import open_sandbox\n"
            "from hermes.sandbox.base import SandboxSettings, SandboxSpec\n"
            f"for i in range({count}):\n"
            f"    open_sandbox(SandboxSpec(image={image!r}, run_id={run!r}, prompt_id=str(i)), SandboxSettings())\n"
            "os._exit(0)\n")
    subprocess.run(on_host(host, [sys.executable, "-c", code]), cwd=ROOT, check=True, timeout=120)


class LiveSandbox:
    """A sandbox of `run` held open by a live process on `host`, closed when its stdin closes."""

    def __init__(self, run: str, image: str, host: str):
        code = ("import sys\n"
                "from hermes.sandbox import open_sandbox\n"
                "from hermes.sandbox.base import SandboxSettings, SandboxSpec\n"
                f"sb = open_sandbox(SandboxSpec(image={image!r}, run_id={run!r}, prompt_id='live'), SandboxSettings())\n"
                "print(sb.container_id, flush=True)\n"
                "sys.stdin.read()\n"
                "sb.close()\n")
        self.proc = subprocess.Popen(on_host(host, [sys.executable, "-c", code]), cwd=ROOT, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.container_id = self.proc.stdout.readline().strip()
        assert self.container_id, "the live sandbox's process did not start one"

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def cleanup_cli(*args: str, host: str | None = None) -> str:
    done = subprocess.run(on_host(host, [sys.executable, "-m", "flows.cli", "sandbox", "cleanup", *args]), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_sandbox_cleanup_removes_only_containers_of_dead_runs(sandbox_image, docker_engine):
    # Every run's start sweeps its host's dead sandboxes: what this test leaves dead is made, held
    # and cleaned up under a host name of its own, so no other test's run removes it first.
    host = own_host()
    dead_run, other_dead_run = uniq("dead"), uniq("dead-too")
    make_dead_containers(dead_run, 2, sandbox_image, host)
    make_dead_containers(other_dead_run, 1, sandbox_image, host)
    live = LiveSandbox(dead_run, sandbox_image, host)
    try:
        assert len(containers_of(docker_engine, dead_run)) == 3

        listed = cleanup_cli("--dry-run", host=host)  # the default: every run's dead containers, and no live one
        assert listed.count(f"run={dead_run} ") == 2 and listed.count(f"run={other_dead_run} ") == 1
        assert "-live-" not in listed and "(owner alive)" not in listed
        assert len(containers_of(docker_engine, dead_run)) == 3  # a dry run removes nothing

        assert "removed 2 container(s)" in cleanup_cli("--run", dead_run, host=host)
        left = containers_of(docker_engine, dead_run)
        assert [c.id for c in left] == [live.container_id]
        assert left[0].exec_run(["echo", "alive"]).output == b"alive\n"  # a live run's container is left alone
        assert len(containers_of(docker_engine, other_dead_run)) == 1  # --run touches no other run

        assert "(owner alive)" in cleanup_cli("--run", dead_run, "--all", "--dry-run", host=host)
        assert "removed 1 container(s)" in cleanup_cli("--run", dead_run, "--all", host=host)
        assert containers_of(docker_engine, dead_run) == []
        assert "removed 1 container(s)" in cleanup_cli("--run", other_dead_run, host=host)
    finally:
        live.close()
        for run in (dead_run, other_dead_run):
            for c in containers_of(docker_engine, run):
                c.remove(force=True)


def test_owner_liveness():
    me = lifecycle.owner_label()
    assert lifecycle.owner_alive(me) is True
    assert lifecycle.owner_alive(me, created=time.time() - 3600 * 24 * 365 * 30) is False  # made before we started: pid reused
    child = subprocess.Popen(["sleep", "30"])
    host = me.rpartition(":")[0]
    assert lifecycle.owner_alive(f"{host}:{child.pid}", created=time.time()) is True
    child.kill()  # not reaped yet: a zombie, which is dead
    until_named("the killed child to count as dead", lambda: lifecycle.owner_alive(f"{host}:{child.pid}") is False, 10)
    child.wait()
    assert lifecycle.owner_alive(f"{host}:{child.pid}") is False
    assert lifecycle.owner_alive(f"some-other-host:{os.getpid()}") is None
    assert lifecycle.owner_alive("") is None


# --------------------------------------------------------------------------- prefetch


@pytest.fixture
def lazy(sandbox_image, docker_engine):
    """lazy(prefetch, image=...) -> a LazySandbox for a fresh run id; closed and checked after."""
    from hermes.sandbox import open_sandbox
    from hermes.sandbox.lazy import LazySandbox

    run = uniq("prefetch")
    made = []

    def _lazy(prefetch: bool, image: str = sandbox_image) -> LazySandbox:
        spec = SandboxSpec(image=image, run_id=run, prompt_id=str(len(made)))
        made.append(LazySandbox(lambda: open_sandbox(spec, SandboxSettings(pull_timeout=5)), 30, prefetch=prefetch))
        return made[-1]

    _lazy.run = run
    yield _lazy
    for box in made:
        box.close()
    assert containers_of(docker_engine, run) == []


def test_prefetch_starts_the_container_before_the_first_tool_call(lazy, docker_engine):
    box = lazy(prefetch=True)
    before = until_named("the prefetched container", lambda: containers_of(docker_engine, lazy.run))
    assert box.wait is None  # no tool call yet
    assert box.exec("echo ready").output == "ready\n"
    # The first tool call ran in the container made before it, and no other was made.
    assert [c.id for c in containers_of(docker_engine, lazy.run)] == [c.id for c in before] and len(before) == 1
    assert isinstance(box.wait, float) and box.wait >= 0
    box.close()
    assert containers_of(docker_engine, lazy.run) == []


def test_without_prefetch_no_container_until_a_tool_needs_one(lazy, docker_engine):
    box = lazy(prefetch=False)
    assert containers_of(docker_engine, lazy.run) == [] and not box.started
    assert box.exec("echo made").output == "made\n"
    assert len(containers_of(docker_engine, lazy.run)) == 1
    box.close()
    assert box.wait > 0  # the first call waited for the container it caused to be made


def test_close_during_prefetch_leaves_nothing(lazy, docker_engine):
    boxes = [lazy(prefetch=True) for _ in range(4)]
    for box in boxes:  # at once: the containers are still being made
        box.close()
    assert containers_of(docker_engine, lazy.run) == []
    with pytest.raises(SandboxError, match="closed"):
        boxes[0].exec("true")


@pytest.mark.parametrize("prefetch", [False, True])
def test_an_abort_while_the_container_is_being_made_stops_the_call_that_waits_for_it(sandbox_image, docker_engine,
                                                                                     prefetch):
    """A stop (a client that left, a prompt past its deadline) that comes while the engine is still
    creating the container finds none to end: the call waiting for it must not then run in it."""
    import threading

    from hermes.sandbox import open_sandbox
    from hermes.sandbox.lazy import LazySandbox

    run = uniq("abort-while-made")
    spec = SandboxSpec(image=sandbox_image, run_id=run, prompt_id="0")
    asked, go_on = threading.Event(), threading.Event()

    def slow_engine():  # the container is created only once the abort has come
        asked.set()
        go_on.wait(60)
        return open_sandbox(spec, SandboxSettings())

    box = LazySandbox(slow_engine, 30, prefetch=prefetch)
    outcome: list = []
    call = threading.Thread(target=lambda: outcome.append(_outcome(lambda: box.exec("sleep 300"))))
    call.start()
    assert asked.wait(30)
    box.abort()
    go_on.set()
    call.join(60)
    assert not call.is_alive(), "the call ran in a sandbox that was aborted"
    assert isinstance(outcome[0], SandboxError) and "closed" in str(outcome[0]), outcome
    box.close()
    until_named("the container made after the abort to go", lambda: containers_of(docker_engine, run) == [])


def _outcome(fn):
    try:
        return fn()
    except Exception as e:
        return e


def test_prefetch_failure_reaches_the_first_tool_call(lazy, docker_engine):
    from hermes.sandbox import ImageUnavailable

    image = unpullable_image(f"never-built-{secrets.token_hex(3)}")  # a closed registry on loopback
    with pytest.raises(ImageUnavailable, match=f"image not available: {re.escape(image)}"):
        lazy(prefetch=True, image=image).exec("true")
    box = lazy(prefetch=True, image=image)
    with pytest.raises(ImageUnavailable, match="image not available"):
        box.exec("true")
    with pytest.raises(ImageUnavailable):  # a later call tries again, and says the same
        box.exec("true")


def test_prefetch_of_a_stopping_run_makes_nothing(lazy, docker_engine):
    lifecycle.stop_run(lazy.run)
    try:
        box = lazy(prefetch=True)
        with pytest.raises(lifecycle.RunInterrupted):
            box.exec("true")
        assert containers_of(docker_engine, lazy.run) == []
    finally:
        lifecycle.resume_run(lazy.run)


# --------------------------------------------------------------------------- engine limits


def test_engine_here_applies_every_limit(sandbox_image, docker_engine):
    from hermes.sandbox import check_limits

    run = uniq("limits")
    assert check_limits(SandboxSettings(), run) == []
    assert containers_of(docker_engine, run) == []  # the probe container is gone


def test_run_refused_when_a_limit_would_not_apply(tmp_path, sandbox_image, docker_engine, caplog):
    """memory="0" is a request the engine answers with no memory limit at all: the same
    read-back that catches an engine dropping a limit refuses the run, naming the limit."""
    from hermes.run.rundir import RunRefused
    from hermes.run.session import RunSession
    from hermes.settings import RunSettings

    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    settings = RunSettings(dataset_file=str(tmp_path / "p.jsonl"), batch_size=1, run_name=uniq("weak"),
                           output_dir=str(tmp_path), sandbox=SandboxSettings(memory="0"))
    with pytest.raises(RunRefused) as refused:
        RunSession.open(settings)
    message = str(refused.value)
    assert "memory limit" in message and "--sandbox_allow_weaker_sandbox" in message
    assert containers_of(docker_engine, settings.run_name) == []

    settings.sandbox.allow_weaker_sandbox = True
    with caplog.at_level("WARNING", logger="hermes"):
        session = RunSession.open(settings)  # accepted: the run goes on, saying so
    session.close()
    said = [r.getMessage() for r in caplog.records if "SANDBOX WEAKER THAN ASKED" in r.getMessage()]
    assert said and "memory limit" in said[0], caplog.text
