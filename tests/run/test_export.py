"""`hermes-batch export`: each format loaded with `datasets`, compared turn by turn with trajectories.jsonl.

A real run (the direct engine, the local sandbox backend, the bundled model server on loopback
scripting parallel tool calls, row checks that pass and fail, a prompt stopped at max_turns), the
real command in a subprocess, and Hugging Face `datasets` reading what it wrote.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.run import direct
from hermes.run.summary import format_summary
from hermes.sandbox.base import SandboxSettings
from hermes.settings import RunSettings
from tests.helpers import read_jsonl, script, tool_responses, write_dataset

ROOT = Path(__file__).resolve().parents[2]
DONE = {"reasoning": "Report.", "content": "Done, all of it."}


def calls(*pairs: tuple[str, dict], reasoning: str = "Work.", content: str | None = None) -> dict:
    turn = {"reasoning": reasoning, "tool_calls": [{"name": n, "arguments": a} for n, a in pairs]}
    return {**turn, "content": content} if content else turn


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from mockllm import MockLLM

    tmp = tmp_path_factory.mktemp("export")
    rows = [
        {"prompt": "Two at once. " + script(
            calls(("terminal", {"command": "echo one"}), ("write_file", {"path": "a.txt", "content": "ä\n"}),
                  content="Starting with two calls."),
            calls(("read_file", {"path": "a.txt"})), DONE), "case": "parallel", "check": "test -f a.txt"},
        {"prompt": "Fails its check. " + script(calls(("terminal", {"command": "echo two"})), DONE),
         "case": "check-fails", "check": "false"},
        {"prompt": "Goes on and on. " + script(*[calls(("terminal", {"command": f"echo {i}"})) for i in range(4)]),
         "case": "partial"},
        {"prompt": "No tools at all. " + script({"reasoning": "Easy.", "content": "42"}), "case": "plain"},
    ]
    with MockLLM() as server:
        stats = direct.run(RunSettings(
            dataset_file=str(write_dataset(tmp / "rows.jsonl", rows)), run_name="exp", output_dir=str(tmp / "data"),
            base_url=server.base_url, model="mock-model", batch_size=2, num_workers=2, max_turns=3,
            distribution="terminal_only", sandbox=SandboxSettings(backend="local")))
    out = tmp / "data" / "exp"
    return out, stats, {e["metadata"]["case"]: e for e in read_jsonl(out / "trajectories.jsonl")}


def export(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", "export", run_dir.name, "--output_dir",
                           str(run_dir.parent), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def load(kind: str, path: Path):
    import datasets

    return datasets.load_dataset(kind, data_files=str(path), split="train")


def gpt_calls(value: str) -> list[dict]:
    return [json.loads(b) for b in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", value, re.S)]


def think(value: str) -> str:
    m = re.match(r"<think>\n(.*?)\n?</think>", value, re.S)
    return m.group(1).strip() if m else ""


def assert_same_conversation(entry: dict, messages: list[dict], tools: list[dict]) -> None:
    """The OpenAI messages say, turn by turn, what the ShareGPT trajectory says."""
    turns = entry["conversations"]
    system = turns[0]["value"]
    listed = json.loads(system[system.index("<tools>\n") + 8:system.index("\n</tools>")])
    assert [t["function"]["name"] for t in tools] == [t["name"] for t in listed]
    assert [t["function"]["parameters"] for t in tools] == [t["parameters"] for t in listed]
    results = iter(tool_responses(entry))
    msgs = iter(messages)
    for turn in turns[1:]:
        if turn["from"] == "human":
            m = next(msgs)
            assert (m["role"], m["content"]) == ("user", turn["value"])
        elif turn["from"] == "gpt":
            m = next(msgs)
            assert m["role"] == "assistant"
            assert m["content"].startswith("<think>") and think(m["content"]) == think(turn["value"])
            assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls") or []] \
                == [(c["name"], c["arguments"]) for c in gpt_calls(turn["value"])]
            expected_ids = [c["id"] for c in m.get("tool_calls") or []]
        else:
            for result in (r for r in [next(results) for _ in turn["value"].split("<tool_response>")[1:]]):
                m = next(msgs)
                assert (m["role"], m["tool_call_id"], m["name"]) == ("tool", result["tool_call_id"], result["name"])
                content = result["content"]
                assert m["content"] == (content if isinstance(content, str) else json.dumps(content, ensure_ascii=False))
                assert m["tool_call_id"] in expected_ids  # the result answers a call of the turn before
    assert next(msgs, None) is None


def test_openai_export_loads_in_datasets_and_says_what_the_trajectories_say(run):
    out, _, entries = run
    done = export(out, "--format", "openai")
    assert done.returncode == 0, done.stderr
    path = out / "export" / "exp.openai.jsonl"
    assert done.stdout.strip() == f"4 trajectories -> {path}"
    rows = load("json", path)
    assert rows.num_rows == len(entries) == 4
    trajectories = read_jsonl(out / "trajectories.jsonl")
    for row, entry in zip(rows, trajectories):
        assert_same_conversation(entry, row["messages"], row["tools"])
    parallel = next(r for r, e in zip(rows, trajectories) if e["metadata"]["case"] == "parallel")
    first = parallel["messages"][1]
    assert [c["function"]["name"] for c in first["tool_calls"]] == ["terminal", "write_file"]
    assert first["content"].endswith("Starting with two calls.")
    assert [m["role"] for m in parallel["messages"][:4]] == ["user", "assistant", "tool", "tool"]
    assert json.loads(parallel["messages"][2]["content"])["output"].strip() == "one"


def test_sharegpt_and_parquet_exports_load_in_datasets(run):
    out, _, entries = run
    trajectories = read_jsonl(out / "trajectories.jsonl")
    assert export(out, "--format", "sharegpt", "--output", str(out / "sg.jsonl")).returncode == 0
    assert (out / "sg.jsonl").read_bytes() == (out / "trajectories.jsonl").read_bytes()
    assert load("json", out / "sg.jsonl").num_rows == 4

    done = export(out, "--format", "parquet")
    assert done.returncode == 0, done.stderr
    rows = load("parquet", out / "export" / "exp.parquet")
    assert rows.num_rows == 4
    for row, entry in zip(rows, trajectories):
        assert row["conversations"] == entry["conversations"]  # turn by turn, the same values
        assert row["prompt_index"] == entry["prompt_index"] and row["completed"] == entry["completed"]
        assert_same_conversation(entry, row["messages"], json.loads(row["tools"]))
    by_case = {r["metadata"]["case"]: r for r in rows}
    assert by_case["parallel"]["reward"]["passed"] is True and by_case["check-fails"]["reward"]["passed"] is False
    assert by_case["plain"]["reward"] is None


def test_only_passed_and_only_completed_choose_their_entries(run):
    out, _, entries = run
    assert entries["partial"]["partial"] and not entries["partial"]["completed"]
    assert export(out, "--format", "openai", "--only", "passed").returncode == 0
    passed = read_jsonl(out / "export" / "exp-passed.openai.jsonl")
    assert len(passed) == 1 and passed[0]["messages"][0]["content"].startswith("Two at once.")
    assert export(out, "--format", "sharegpt", "--only", "completed").returncode == 0
    completed = read_jsonl(out / "export" / "exp-completed.sharegpt.jsonl")
    assert sorted(e["metadata"]["case"] for e in completed) == ["check-fails", "parallel", "plain"]


def test_reasoning_in_its_own_field_when_asked(run):
    out, _, entries = run
    assert export(out, "--format", "openai", "--reasoning", "field", "--output", str(out / "f.jsonl")).returncode == 0
    plain = next(r for r in read_jsonl(out / "f.jsonl") if r["messages"][0]["content"].startswith("No tools"))
    assert plain["messages"][1] == {"role": "assistant", "content": "42", "reasoning_content": "Easy."}


def test_a_run_without_trajectories_is_refused_with_the_command_that_makes_them(tmp_path):
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "batch_0.jsonl").write_text("")
    done = export(tmp_path / "fresh", "--format", "openai")
    assert done.returncode == 2
    assert "trajectories.jsonl does not exist yet: run `hermes-batch merge fresh` first" in done.stderr


def test_the_end_of_run_summary_shows_what_happened_and_names_the_viewer(run):
    out, stats, _ = run
    text = format_summary(stats, out.parent)
    lines = text.splitlines()
    assert lines[0] == "Run exp: 4 of 4 prompts done (1 stopped at max_turns), 0 failed, 0 discarded (no reasoning)"
    assert "Checks: 1 of 2 passed (50.0%)" in lines
    tools = lines[lines.index("Tools used:") + 1:]
    named = [line.split()[0] for line in tools if line.startswith("  ")]
    assert set(named) == {"terminal", "write_file", "read_file"}  # only the tools that were called
    assert not any(" 0 calls" in line for line in lines)
    assert "Failures by kind:" not in text  # none failed
    assert f"look at it:   hermes-batch view exp --output_dir {out.parent}" in lines
    assert len(lines) < 25  # one screen
