"""The abuse suite: one real batch run whose prompts' tool calls attack their sandbox.

The real batch-run flow on Prefect, real containers, the bundled model server on loopback
scripting each attack as the tool calls a model would make. Every attack must be contained,
answered with a clear tool result, must not stop the normal prompts of the same run, and
must leave no container behind.
"""
from __future__ import annotations

import json
import re
import secrets
import threading
from pathlib import Path

import pytest

from hermes.sandbox.base import SandboxSettings
from hermes.settings import RunSettings
from tests.conftest import containers_of
from tests.helpers import LoopbackListener, interfaces, routes, tool_responses

RUN = f"abuse-{secrets.token_hex(3)}"
#: the suite runs under the engine's default runtime and under gVisor (the `runsc` fixture says
#: whether this machine can: skipped with the engine's answer where it cannot)
RUNTIMES = ("runc", "runsc")
#: what writing to the read-only root as nobody says: gVisor's kernel checks the permission first
READ_ONLY = {"runc": "Read-only file system", "runsc": "Read-only file system|Permission denied"}
LIMITS = dict(command_timeout=5, memory="128m", tmpfs_size="16m", pids_limit=64, output_limit=2000)


def script(*turns: dict) -> str:
    return "MOCK_SCRIPT: " + json.dumps({"turns": [*turns, {"reasoning": "Report.", "content": "Done."}]})


def calls(*commands: str | dict) -> dict:
    """One model turn calling `terminal` once per command (a dict is a whole tool call)."""
    tool_calls = [c if isinstance(c, dict) else {"name": "terminal", "arguments": {"command": c}} for c in commands]
    return {"reasoning": "Try it.", "tool_calls": tool_calls}


def attacks(marker: Path, host_port: int) -> dict[str, str]:
    return {
        "fork_bomb": script(calls("bomb(){ bomb|bomb& }; bomb; while :; do :; done")),
        "memory_hog": script(calls("dd if=/dev/zero of=/dev/null bs=400M count=1 && echo got-it"),
                             calls("echo still-here")),
        "disk_fill": script(calls(*(f"dd if=/dev/zero of={p} bs=1M count=1000" for p in
                                    ("/workspace/fill", "/tmp/fill", "/dev/shm/fill", "/fill")))),
        "endless_output": script(calls("yes flood")),
        "sleep_forever": script(calls("sleep 2147483647", {"name": "terminal", "arguments": {
            "command": "sleep 100000", "timeout": 100000}})),
        # Nothing is aimed off the machine: the sandbox's interfaces and routes, and a dial of the
        # test's own listener on the host's loopback (the sandbox's 127.0.0.1 must be its own).
        "network": script(calls(f"nc -w 3 127.0.0.1 {host_port} </dev/null", "cat /proc/net/dev",
                                "cat /proc/net/route")),
        "root_fs": script(calls("echo pwned >> /etc/passwd", "touch /bin/evil", "mkdir /evil",
                                {"name": "write_file", "arguments": {"path": "/usr/bin/evil", "content": "x"}})),
        "host_files": script(calls(f"cat {marker}", f"ls -la {marker.parent}",
                                   "find / -path /proc -prune -o -path /sys -prune -o -name 'host-marker*' -print"
                                   " 2>/dev/null; echo searched",
                                   "ls -la /var/run/docker.sock /run/docker.sock",
                                   {"name": "read_file", "arguments": {"path": str(marker)}})),
        "escalate": script(calls("id -u", "su root -c 'id -u'", "sudo id -u",
                                 "cp /bin/busybox /tmp/busybox && chmod 4755 /tmp/busybox && /tmp/busybox id -u",
                                 "cp /bin/busybox /tmp/bb2 && chown 0:0 /tmp/bb2",
                                 "grep -E 'CapEff|NoNewPrivs' /proc/self/status")),
    }


def _process_count() -> int:
    return sum(1 for p in Path("/proc").iterdir() if p.name.isdigit())


@pytest.fixture(scope="module", params=RUNTIMES)
def abuse_run(request, tmp_path_factory, sandbox_image, docker_engine, prefect_harness):
    """Runs the whole suite once per runtime: {case: trajectory entry}, plus what the test saw meanwhile."""
    from flows.batch import batch_run
    from mockllm import MockLLM

    runtime = request.getfixturevalue("runsc") if request.param == "runsc" else None
    run_name = f"{RUN}-{request.param}"
    tmp = tmp_path_factory.mktemp("abuse")
    secret = f"HOSTSECRET-{secrets.token_hex(8)}"
    marker = tmp / "host-marker.txt"
    marker.write_text(secret + "\n")
    with MockLLM() as llm, LoopbackListener() as host:
        cases = attacks(marker, host.port)
        rows = [{"prompt": f"Case {name}. {text}", "case": name} for name, text in cases.items()]
        rows += [{"prompt": f"Normal task {i}: note a token and report the hostname.", "case": f"normal_{i}"}
                 for i in range(3)]
        dataset = tmp / "abuse.jsonl"
        dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
        settings = RunSettings(dataset_file=str(dataset), run_name=run_name, output_dir=str(tmp / "data"),
                               base_url=llm.base_url, model="mock-model", batch_size=4, num_workers=12,
                               sandbox=SandboxSettings(**LIMITS, runtime=runtime))
        host_pids, stop = [], threading.Event()

        def host_watch():  # the host's process table while the sandboxes are attacked (the fork bomb)
            while not stop.wait(0.2):
                host_pids.append(_process_count())

        baseline = _process_count()
        watcher = threading.Thread(target=host_watch, daemon=True)
        watcher.start()
        try:
            stats = batch_run(settings=settings)
        finally:
            stop.set()
            watcher.join()
    out = Path(settings.output_dir) / run_name
    journal = [json.loads(l) for p in sorted(out.glob("batch_*.jsonl")) for l in p.read_text().splitlines() if l]
    return {"entries": {e["metadata"]["case"]: e for e in journal}, "stats": stats, "secret": secret,
            "host_pids": host_pids, "host_baseline": baseline, "host_accepted": host.accepted,
            "leftovers": containers_of(docker_engine, run_name), "marker": marker, "runtime": request.param}


def results(abuse_run, case: str) -> list[dict]:
    entry = abuse_run["entries"][case]
    assert entry["completed"] and entry["hermes"]["status"] == "completed", entry["hermes"]
    return [r["content"] for r in tool_responses(entry)]


def test_every_prompt_of_the_run_finished(abuse_run):
    entries = abuse_run["entries"]
    assert len(entries) == 12
    assert all(e["hermes"]["status"] == "completed" for e in entries.values()), \
        {k: e["hermes"]["error"] for k, e in entries.items() if e["hermes"]["status"] != "completed"}
    assert abuse_run["stats"]["trajectories_written"] == 12 and abuse_run["stats"]["prompts_failed"] == 0


def test_normal_prompts_are_unharmed(abuse_run):
    for i in range(3):
        out = {r["name"]: r["content"] for r in tool_responses(abuse_run["entries"][f"normal_{i}"])}
        assert out["write_file"].get("error") is None
        assert out["terminal"]["exit_code"] == 0 and out["terminal"]["output"].strip()
        assert "token " in out["read_file"]["content"]


def test_no_container_of_the_run_remains(abuse_run):
    assert abuse_run["leftovers"] == []


def test_the_hosts_process_table_stayed_bounded(abuse_run):
    # Twelve sandboxes of at most 64 processes each: an unbounded fork bomb would add thousands.
    # The slack is for the run's own threads and helpers and for other work on a shared machine.
    assert abuse_run["host_pids"], "the watcher took no samples"
    assert max(abuse_run["host_pids"]) < abuse_run["host_baseline"] + 12 * 64 + 1500, \
        (abuse_run["host_baseline"], max(abuse_run["host_pids"]))


def test_fork_bomb_is_held_by_the_process_limit(abuse_run):
    (bomb,) = results(abuse_run, "fork_bomb")
    # The pids limit makes forks fail (the shell says so). Then either the command's own shell
    # cannot fork and gives up (exit 2), or it spins until the time limit kills it and the bomb.
    assert "can't fork" in bomb["output"], bomb
    assert (bomb["exit_code"], bomb["error"]) in ((2, None), (-1, "Command timed out after 5s")), bomb


def test_memory_hog_is_killed_and_the_model_is_told(abuse_run):
    hog, after = results(abuse_run, "memory_hog")
    assert hog.get("exit_code") != 0 and "got-it" not in json.dumps(hog)
    if abuse_run["runtime"] == "runsc":
        # gVisor's kernel is one host process under the memory limit: the host's OOM killer ends
        # the whole sandbox (SIGKILL: exit 137; the engine does not always flag it OOMKilled), and
        # the model is told it stopped, at the hog's call or the next one
        assert re.search(r"has stopped.*exit code 137", json.dumps([hog, after])), (hog, after)
    else:
        assert "ran out of memory (limit 128m)" in hog["output"], hog
        assert after["output"] == "still-here\n"  # only the hog died, not the sandbox


def test_disk_cannot_be_filled(abuse_run):
    workspace, tmp, shm, root = results(abuse_run, "disk_fill")
    for r in (workspace, tmp, shm):  # each writable place is a tmpfs capped at 16m
        assert r["exit_code"] != 0 and "No space left on device" in r["output"], r
        assert int(re.search(r"(\d+)\+\d+ records out", r["output"]).group(1)) <= 16, r
    assert root["exit_code"] != 0 and re.search(READ_ONLY[abuse_run["runtime"]], root["output"]), root


def test_endless_output_is_cut_and_killed(abuse_run):
    (flood,) = results(abuse_run, "endless_output")
    assert flood["truncated"] is True and flood["exit_code"] == -1
    assert flood["output"].startswith("flood\nflood\n") and "\n[output truncated: " in flood["output"]
    # Killed once it has written 8 MB more than it may return (or by the time limit, on a crawling host).
    assert "[command killed: it kept writing output" in flood["output"] or flood["error"] == "Command timed out after 5s"


def test_sleep_forever_hits_the_time_limit(abuse_run):
    plain, asked_longer = results(abuse_run, "sleep_forever")
    for r in (plain, asked_longer):  # a model asking for a longer timeout gets the run's limit
        assert r["exit_code"] == -1 and r["error"] == "Command timed out after 5s", r


def test_network_is_unreachable(abuse_run):
    dial, dev, route = results(abuse_run, "network")
    assert dial["exit_code"] != 0 and "Connection refused" in dial["output"], dial  # its own, empty loopback
    assert abuse_run["host_accepted"] == []  # the test's listener on the host saw nothing
    assert interfaces(dev["output"]) == ["lo"], dev
    assert routes(route["output"]) == [], route  # no route: any other address fails before a packet is sent


def test_root_filesystem_is_read_only(abuse_run):
    passwd, bin_file, directory, tool_write = results(abuse_run, "root_fs")
    assert passwd["exit_code"] != 0 and "Permission denied" in passwd["output"]  # root's file; nobody we are
    for r in (bin_file, directory):
        assert r["exit_code"] != 0 and re.search(READ_ONLY[abuse_run["runtime"]], r["output"]), r
    assert re.search(r"Read-only file system|Permission denied", tool_write["error"]), tool_write


def test_host_files_are_out_of_reach(abuse_run):
    cat, ls, find, socket, read = results(abuse_run, "host_files")
    assert cat["exit_code"] != 0 and "No such file" in cat["output"]
    assert ls["exit_code"] != 0
    assert find["output"].strip() == "searched"
    assert socket["exit_code"] != 0 and "No such file" in socket["output"]
    assert "not found" in read["error"].lower()
    everything = json.dumps([e["conversations"] for e in abuse_run["entries"].values()])
    assert abuse_run["secret"] not in everything


def test_no_way_to_root(abuse_run):
    uid, su, sudo, setuid, chown, status = results(abuse_run, "escalate")
    assert uid["output"].strip() == "65534"
    assert su["exit_code"] != 0 and "\n0\n" not in "\n" + su["output"]
    assert sudo["exit_code"] == 127
    assert setuid["output"].strip().splitlines()[-1] == "65534"  # setuid grants nothing: nosuid, no-new-privileges
    assert chown["exit_code"] != 0 and "Operation not permitted" in chown["output"]
    fields = dict(line.split(":", 1) for line in status["output"].splitlines())
    assert fields["CapEff"].strip() == "0000000000000000"
    if abuse_run["runtime"] != "runsc":  # gVisor's /proc does not show it (the engine applies it to the sandbox's kernel)
        assert fields["NoNewPrivs"].strip() == "1"


def test_the_run_records_how_long_prompts_waited_for_their_sandbox(abuse_run):
    # Every case makes a tool call, so every prompt waited (maybe 0 s) for its sandbox, within its own time.
    waits = {k: (e["hermes"]["sandbox_wait"], e["hermes"]["elapsed"]) for k, e in abuse_run["entries"].items()}
    assert all(isinstance(w, float) and 0 <= w <= elapsed for w, elapsed in waits.values()), waits
