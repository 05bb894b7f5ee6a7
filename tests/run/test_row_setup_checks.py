"""Rows that prepare and judge their own sandbox (files, setup, check), and the per-prompt deadline.

Whole runs without Prefect (hermes.run.direct, as `--engine direct`), on real containers, the real
DuckDB index and the bundled model server on loopback scripting the model's tool calls.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes.run import direct
from hermes.run.merge import merge
from hermes.sandbox import get_backend
from hermes.sandbox.base import SandboxSettings
from hermes.settings import RunSettings
from tests.conftest import containers_of
from tests.helpers import read_jsonl, script, tool_responses, write_dataset


def terminal(*commands: str, timeout: int | None = None) -> dict:
    args = [{"command": c, **({"timeout": timeout} if timeout else {})} for c in commands]
    return {"reasoning": "Run it.", "tool_calls": [{"name": "terminal", "arguments": a} for a in args]}


def write(path: str, content: str) -> dict:
    return {"reasoning": "Write it.", "tool_calls": [{"name": "write_file", "arguments": {"path": path, "content": content}}]}


DONE = {"reasoning": "Report.", "content": "Done."}


#: rows' files, setup and checks behave alike on every isolating backend
both_backends = pytest.mark.parametrize("backend", ["docker", "runc"])


def settings(tmp_path: Path, rows: list[dict], name: str, base_url: str, backend: str = "docker", **kw) -> RunSettings:
    dataset = write_dataset(tmp_path / f"{name}.jsonl", rows)
    sandbox = (kw.pop("sandbox", None) or SandboxSettings()).model_copy(update={"backend": backend})
    if not get_backend(sandbox).available():
        pytest.skip(f"the {backend} backend cannot run here (runc needs root)")
    return RunSettings(dataset_file=str(dataset), run_name=name, output_dir=str(tmp_path / "data"), base_url=base_url,
                       model="mock-model", batch_size=2, num_workers=3, sandbox=sandbox, **kw)


def leftovers(docker_engine, run: str, backend: str) -> list:
    return containers_of(docker_engine, run) + get_backend(SandboxSettings(backend=backend)).leftovers(run)


def journal(tmp_path: Path, name: str) -> dict[str, dict]:
    run = tmp_path / "data" / name
    return {e["metadata"]["case"]: e for p in sorted(run.glob("batch_*.jsonl")) for e in read_jsonl(p)}


@both_backends
def test_setup_is_there_at_the_first_tool_call_and_a_failing_setup_fails_only_its_prompt(
        tmp_path, mock_llm, sandbox_image, docker_engine, backend):
    rows = [
        {"prompt": "Look around. " + script(terminal("cat src/app.py build/marker build/copy; ls -a /tmp"), DONE),
         "case": "prepared", "cwd": "/workspace/proj",
         "files": {"src/app.py": "print('from the dataset')\n", "data.txt": "copied-by-setup\n",
                   "/tmp/abs.txt": "absolute\n"},
         "setup": ["mkdir -p build && echo built-by-setup > build/marker", "cp data.txt build/copy"]},
        {"prompt": "Never reached. " + script(terminal("echo the model ran"), DONE), "case": "broken",
         "setup": ["echo preparing", "echo the-reason-it-broke >&2; exit 3"]},
        {"prompt": "An ordinary row. " + script(terminal("echo ordinary"), DONE), "case": "plain"},
    ]
    s = settings(tmp_path, rows, "setup", mock_llm.base_url, backend)
    stats = direct.run(s)
    entries = journal(tmp_path, "setup")

    prepared = entries["prepared"]
    assert prepared["hermes"]["status"] == "completed", prepared["hermes"]["error"]
    out = tool_responses(prepared)[0]["content"]["output"]
    assert out.splitlines()[:3] == ["print('from the dataset')", "built-by-setup", "copied-by-setup"]
    assert "abs.txt" in out
    # the row's preparation is no part of what is kept: not in the trajectory, not in its metadata
    kept = json.dumps(prepared)
    assert "mkdir -p build" not in kept and "copied-by-setup\\n\"" not in kept
    assert not {"files", "setup", "check"} & prepared["metadata"].keys()

    broken = entries["broken"]
    assert broken["hermes"]["status"] == "failed" and broken["api_calls"] == 0  # no model call was spent
    error = broken["hermes"]["error"]
    assert error.startswith("setup command 2/2 failed (exit 3): echo the-reason-it-broke") and "the-reason-it-broke" in error
    assert entries["plain"]["hermes"]["status"] == "completed"
    assert stats["prompts_failed"] == 1 and stats["trajectories_written"] == 2
    assert stats["failure_reasons"] == {"row setup failed": {"count": 1, "example": error}}
    assert leftovers(docker_engine, "setup", backend) == []


@both_backends
def test_checks_become_rewards_the_filter_keeps_the_passing_and_resume_reruns_none(
        tmp_path, mock_llm, sandbox_image, docker_engine, backend):
    check = "seq 1 3000; grep -qx 42 /workspace/answer.txt"  # a long output, then the verdict
    rows = [
        {"prompt": "Answer well. " + script(write("answer.txt", "42\n"), DONE), "case": "right", "check": check},
        {"prompt": "Answer badly. " + script(write("answer.txt", "41\n"), DONE), "case": "wrong", "check": check},
        {"prompt": "No check. " + script(terminal("echo unjudged"), DONE), "case": "unchecked"},
    ]
    s = settings(tmp_path, rows, "checks", mock_llm.base_url, backend, require_check_pass=True)
    stats = direct.run(s)
    entries = journal(tmp_path, "checks")

    right, wrong = entries["right"]["reward"], entries["wrong"]["reward"]
    assert right["passed"] is True and right["exit_code"] == 0 and not right["timed_out"]
    assert wrong["passed"] is False and wrong["exit_code"] == 1
    for reward in (right, wrong):  # bounded: the end of the output, where it was cut said so
        assert reward["truncated"] and reward["output"].startswith("[...]") and reward["output"].endswith("2999\n3000\n")
        assert len(reward["output"]) < 4100
    assert "reward" not in entries["unchecked"]
    assert all(e["hermes"]["status"] == "completed" for e in entries.values())  # a failed check is no failed prompt

    out = tmp_path / "data" / "checks"
    written = read_jsonl(out / "trajectories.jsonl")
    assert [e["metadata"]["case"] for e in written] == ["right"] and written[0]["reward"] == right
    assert stats["check_statistics"] == {"checked": 2, "passed": 1, "failed": 1, "pass_rate": 50.0, "timed_out": 0,
                                         "exit_codes": {"0": 1, "1": 1}}
    assert stats["dropped_check_failed"] == 1 and stats["dropped_unchecked"] == 1 and stats["trajectories_written"] == 1
    assert json.loads((out / "statistics.json").read_text())["check_statistics"]["pass_rate"] == 50.0

    # resume: every prompt ran to an end, so none is owed again, whatever its check said
    asked = len(mock_llm.requests())
    batches = sorted(p.name for p in out.glob("batch_*.jsonl"))
    again = direct.run(s.model_copy(update={"resume": True}))
    assert sorted(p.name for p in out.glob("batch_*.jsonl")) == batches
    assert again["check_statistics"] == stats["check_statistics"]
    assert len(mock_llm.requests()) == asked  # no model call either

    # without the filter the same journal keeps every entry, each with its reward
    unfiltered = merge(out, require_check_pass=False)
    assert unfiltered["trajectories_written"] == 3 and unfiltered["dropped_check_failed"] == 0
    assert {e["metadata"]["case"]: e.get("reward") for e in read_jsonl(out / "trajectories.jsonl")} == \
        {"right": right, "wrong": wrong, "unchecked": None}
    assert leftovers(docker_engine, "checks", backend) == []


@both_backends
def test_a_prompt_past_its_deadline_ends_failed_and_leaves_nothing(tmp_path, mock_llm, sandbox_image, docker_engine, backend):
    rows = [{"prompt": "Wait forever. " + script(terminal("sleep 600", timeout=600), DONE), "case": "stuck",
             "check": "true"},
            {"prompt": "Be quick. " + script(terminal("echo quick"), DONE), "case": "quick"}]
    s = settings(tmp_path, rows, "deadline", mock_llm.base_url, backend, prompt_timeout=4,
                 sandbox=SandboxSettings(command_timeout=600))
    stats = direct.run(s)
    entries = journal(tmp_path, "deadline")

    stuck = entries["stuck"]["hermes"]
    assert stuck["status"] == "failed" and "--prompt_timeout" in stuck["error"] and "4s" in stuck["error"]
    # the deadline ended it at 4 s (plus the time to stop its command and remove its sandbox on a
    # loaded machine), not the 600 s sleep, nor the 600 s command limit
    assert 4 <= stuck["elapsed"] < 30, stuck
    assert "reward" not in entries["stuck"]  # an unfinished prompt is not judged
    assert entries["quick"]["hermes"]["status"] == "completed"
    assert stats["prompts_failed"] == 1
    assert leftovers(docker_engine, "deadline", backend) == []
