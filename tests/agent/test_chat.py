"""`hermes-batch chat`: one agent run outside batches, saving trajectories when asked."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def chat(tmp_path: Path, base_url: str, *args: str, home: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HERMES_HOME": str(home or tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "flows.cli", "chat", *args, "--base_url", base_url, "--model", "mock-model"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          )


def lines(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines()]


@pytest.fixture(autouse=True)
def _pythonpath(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))


def test_nothing_is_saved_by_default(tmp_path, mock_llm, sandbox_image):
    done = chat(tmp_path, mock_llm.base_url, "Say hello")
    assert done.returncode == 0, done.stderr
    assert "Done." in done.stdout
    assert not (tmp_path / "trajectory_samples.jsonl").exists()


def test_flag_saves_a_completed_conversation(tmp_path, mock_llm, sandbox_image):
    done = chat(tmp_path, mock_llm.base_url, "Note a token", "--save-trajectories")
    assert done.returncode == 0, done.stderr
    [entry] = lines(tmp_path / "trajectory_samples.jsonl")
    assert set(entry) == {"conversations", "timestamp", "model", "completed"}
    assert entry["completed"] is True and entry["model"] == "mock-model"
    assert [t["from"] for t in entry["conversations"]] == ["system", "human", "gpt", "tool", "gpt", "tool", "gpt"]
    assert "token" in entry["conversations"][5]["value"]  # read back from the sandbox
    assert not (tmp_path / "failed_trajectories.jsonl").exists()


def test_config_turns_saving_on_and_failures_go_to_their_own_file(tmp_path, mock_llm, sandbox_image):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("agent:\n  save_trajectories: true\n")
    script = "MOCK_SCRIPT: " + json.dumps({"turns": [
        {"reasoning": "r", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo 1"}}]},
        {"reasoning": "r", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo 2"}}]}]})
    done = chat(tmp_path, mock_llm.base_url, script, "--max_turns", "1", home=home)
    assert done.returncode == 1
    [entry] = lines(tmp_path / "failed_trajectories.jsonl")
    assert entry["completed"] is False
    assert not (tmp_path / "trajectory_samples.jsonl").exists()


def test_a_bad_config_file_is_named(tmp_path, mock_llm):
    bad = tmp_path / "c.yaml"
    bad.write_text("agent: [unclosed\n")
    done = chat(tmp_path, mock_llm.base_url, "hi", "--config", str(bad))
    assert done.returncode == 2 and str(bad) in done.stderr and "YAML" in done.stderr
