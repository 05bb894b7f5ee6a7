"""`--setup_timeout`, `--check_timeout` and `--sandbox_network`, each given as a flag of a whole run.

`batch_runner.py --engine=direct` in a subprocess (so the flag itself is what is tested, through the
command line's parsing), on real containers, the bundled model server on loopback scripting the tool
calls. Each run has a name of its own: the engine is shared, and its containers are counted by name.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import containers_of
from tests.helpers import (
    LoopbackListener,
    interfaces,
    read_jsonl,
    routes,
    script,
    tool_responses,
    unique_run,
    write_dataset,
)

ROOT = Path(__file__).resolve().parents[2]
DONE = {"reasoning": "Report.", "content": "Done."}

# Past --setup_timeout / --check_timeout only the flag may end the `sleep 600`: every command's own
# limit is raised past it, and the prompt's deadline is the backstop. Were the flag ignored, the
# prompt would end at that deadline instead, failed with a reason naming --prompt_timeout, which the
# tests tell apart from the flag's own reason (no clock is read; the deadline only bounds the wait).
SLOW = ["--sandbox_command_timeout=600", "--prompt_timeout=120"]


def terminal(command: str) -> dict:
    return {"reasoning": "Run it.", "tool_calls": [{"name": "terminal", "arguments": {"command": command}}]}


def run(tmp_path: Path, rows: list[dict], name: str, base_url: str,
        *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    """The whole run, then its journal entries by their row's `case`."""
    dataset = write_dataset(tmp_path / f"{name}.jsonl", rows)
    cmd = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", f"--run_name={name}",
           f"--base_url={base_url}", "--model=mock-model", "--engine=direct", "--distribution=terminal_only",
           "--batch_size=2", "--num_workers=3", "--prompt_retries=0", *flags]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    folder = tmp_path / "data" / name
    entries = {e["metadata"]["case"]: e for p in sorted(folder.glob("batch_*.jsonl")) for e in read_jsonl(p)}
    return done, entries


def test_a_setup_past_setup_timeout_fails_its_prompt_with_its_output_and_the_run_goes_on(
        tmp_path, mock_llm, sandbox_image, docker_engine):
    name = unique_run("setup-timeout")
    rows = [
        {"prompt": "Never reached. " + script(terminal("echo the model ran"), DONE), "case": "stuck",
         "setup": ["echo setup-began; sleep 600", "echo second-command"]},
        {"prompt": "Quick setup. " + script(terminal("cat /tmp/ready"), DONE), "case": "quick",
         "setup": "echo ready > /tmp/ready"},
        {"prompt": "Plain. " + script(terminal("echo plain"), DONE), "case": "plain"},
    ]
    done, entries = run(tmp_path, rows, name, mock_llm.base_url, "--setup_timeout=3", *SLOW)
    assert done.returncode == 0, done.stderr[-3000:]  # 1 of 3 failed: within --max_failed_share

    stuck = entries["stuck"]
    error = stuck["hermes"]["error"] or ""
    assert stuck["hermes"]["status"] == "failed", stuck["hermes"]
    # the reason names the setup's limit and the command it stopped, with that command's output
    # (README: "the first that fails fails the prompt, with its output as the reason")
    assert error.startswith("setup command 1/2 did not finish within setup's 3s (--setup_timeout): "
                            "echo setup-began; sleep 600"), error
    assert "setup-began" in error.splitlines()[-1] and "--prompt_timeout" not in error
    assert stuck["hermes"]["error_kind"] == "row setup failed" and stuck["api_calls"] == 0  # the agent never began
    assert "reward" not in stuck

    # the other rows ran to their end, the quick one's setup done before its first tool call
    assert entries["quick"]["hermes"]["status"] == "completed"
    assert tool_responses(entries["quick"])[0]["content"]["output"].strip() == "ready"
    assert entries["plain"]["hermes"]["status"] == "completed"
    stats = json.loads((tmp_path / "data" / name / "statistics.json").read_text())
    assert stats["prompts_failed"] == 1 and stats["trajectories_written"] == 2
    assert containers_of(docker_engine, name) == []  # the stuck sleep's container went too


def test_a_check_past_check_timeout_counts_as_failed_and_its_prompt_is_not(
        tmp_path, mock_llm, sandbox_image, docker_engine):
    name = unique_run("check-timeout")
    rows = [
        {"prompt": "Work. " + script(terminal("echo worked"), DONE), "case": "slow",
         "check": "echo check-began; sleep 600"},
        {"prompt": "Work too. " + script(terminal("echo worked"), DONE), "case": "fast", "check": "echo fine"},
    ]
    done, entries = run(tmp_path, rows, name, mock_llm.base_url, "--check_timeout=3", *SLOW)
    assert done.returncode == 0, done.stderr[-3000:]

    slow = entries["slow"]
    # settings: "past it the check counts as failed"; README: "a failed check is not a failed prompt"
    assert slow["hermes"]["status"] == "completed" and slow["hermes"]["error"] is None, slow["hermes"]
    reward = slow["reward"]
    assert reward["passed"] is False and reward["timed_out"] is True, reward
    assert reward["output"].startswith("check-began"), reward  # what it said before it was stopped
    assert entries["fast"]["reward"]["passed"] is True and entries["fast"]["reward"]["timed_out"] is False

    stats = json.loads((tmp_path / "data" / name / "statistics.json").read_text())
    assert stats["prompts_failed"] == 0
    checks = stats["check_statistics"]
    assert (checks["checked"], checks["passed"], checks["failed"], checks["timed_out"]) == (2, 1, 1, 1), checks
    assert containers_of(docker_engine, name) == []


# What the sandbox sees of the network, aimed nowhere off this machine: its interfaces and routes
# (/proc), and a dial of the test's own listener at 127.0.0.1 (the host's loopback must stay out of
# reach: the sandbox's 127.0.0.1 is its own). The mini image has nc; the Debian one has bash.
PROBE = ("cat /proc/net/dev; echo ==; cat /proc/net/route; echo ==; "
         "if command -v nc >/dev/null; then nc -w 3 127.0.0.1 {port} </dev/null; "
         "else bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}'; fi; echo rc=$?")


# The flag takes a boolean (true/false, 1/0, yes/no, on/off; alone it means true); the default is
# no network (README: "Defaults: no network").
@pytest.mark.parametrize("flags, networked", [
    ((), False),
    (("--sandbox_network=false",), False),
    (("--sandbox_network",), True),
    (("--sandbox_network", "true"), True),
], ids=["default", "false", "bare", "true"])
def test_sandbox_network_flag_gives_a_network_only_when_asked(tmp_path, mock_llm, sandbox_image, docker_engine,
                                                             flags, networked):
    name = unique_run("network")
    with LoopbackListener() as host:
        rows = [{"prompt": "Probe. " + script(terminal(PROBE.format(port=host.port)), DONE), "case": "probe"}]
        done, entries = run(tmp_path, rows, name, mock_llm.base_url, *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    probe = entries["probe"]
    assert probe["hermes"]["status"] == "completed", probe["hermes"]
    dev, route, dial = tool_responses(probe)[0]["content"]["output"].split("==\n")
    if networked:
        # The open case shows only as the engine's network handed to the container (an interface
        # beside lo, a route): reaching anything through it would mean dialling a bridge or LAN
        # address, which no test here does (tests/sandbox/test_sandbox.py checks the same way).
        assert set(interfaces(dev)) - {"lo"} and routes(route), (dev, route)
    else:
        assert interfaces(dev) == ["lo"] and routes(route) == [], (dev, route)
        assert "Connection refused" in dial and "rc=0" not in dial, dial
        assert host.accepted == []  # the host's listener saw nothing
    assert containers_of(docker_engine, name) == []
