"""`--engine direct`: the same run without Prefect — same outputs, same resume, no server booted."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.settings import RunSettings
from tests.conftest import containers_of
from tests.helpers import read_jsonl, script, tool_responses, unique_run, until, write_dataset

DIRECT = unique_run("direct")  # its containers' label: unique on a shared engine
MIXED = unique_run("mixed-engines")  # its containers' label: unique on a shared engine

ROOT = Path(__file__).resolve().parents[2]
INTERRUPTED = unique_run("interrupted")  # its containers' label (test_local_server has an "interrupted" run too)


def cli(tmp_path: Path, dataset: Path, run_name: str, base_url: str, *extra: str, env: dict | None = None,
        importtime: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), str(ROOT / "batch_runner.py"),
           f"--dataset_file={dataset}", "--batch_size=2", f"--run_name={run_name}", f"--base_url={base_url}",
           "--model=mock-model", "--num_workers=3", *extra]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def imported_modules(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_direct_run_writes_what_a_prefect_run_writes_and_never_loads_prefect(tmp_path, mock_llm, sandbox_image,
                                                                               docker_engine):
    rows = [{"prompt": f"Prompt {i}", "source": "direct"} for i in range(5)]
    rows.append({"prompt": "Custom " + script(
        {"reasoning": "Who am I?", "tool_calls": [{"name": "terminal", "arguments": {"command": "id -u; pwd"}}]},
        {"reasoning": "Done.", "content": "Finished."}), "cwd": "/workspace/project"})
    dataset = write_dataset(tmp_path / "prompts.jsonl", rows)

    done = cli(tmp_path, dataset, DIRECT, mock_llm.base_url, "--engine=direct", importtime=True)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = imported_modules(done.stderr)
    assert {"hermes.run.direct", "hermes.run.orchestration", "docker"} <= loaded  # the one orchestration, no Prefect
    assert not {m for m in loaded if m == "prefect" or m.startswith("prefect.")}, "the direct engine loaded Prefect"
    # nothing streamed, no image looked at or drawn: the openai SDK (0.7 s of a start) stays unloaded
    assert "openai" not in loaded, "a run with no stream, vision or image call loaded the openai SDK"

    out = tmp_path / "data" / DIRECT
    assert {"trajectories.jsonl", "batch_0.jsonl", "batch_1.jsonl", "batch_2.jsonl", "checkpoint.json",
            "statistics.json"} <= {p.name for p in out.iterdir()}
    entries = read_jsonl(out / "trajectories.jsonl")
    assert sorted(e["prompt_index"] for e in entries) == list(range(6))
    assert all(e["completed"] and e["metadata"]["model"] == "mock-model" for e in entries)
    custom = next(e for e in entries if e["prompt_index"] == 5)
    terminal = next(r for r in tool_responses(custom) if r["name"] == "terminal")
    assert terminal["content"]["output"].split() == ["65534", "/workspace/project"]  # its sandbox, its cwd
    stats = json.loads((out / "statistics.json").read_text())
    assert stats["trajectories_written"] == 6 and stats["total_batches"] == 3
    assert json.loads((out / "checkpoint.json").read_text())["completed_prompts"] == list(range(6))
    assert "6/6 prompts (100%)" in done.stderr  # the progress line
    assert str(Path("data") / DIRECT / "trajectories.jsonl") in done.stdout
    assert containers_of(docker_engine, DIRECT) == []


@pytest.mark.usefixtures("prefect_harness")
def test_a_direct_run_resumes_as_a_prefect_flow_and_back(tmp_path, mock_llm, sandbox_image, docker_engine):
    from flows.batch import batch_run

    dataset = write_dataset(tmp_path / "prompts.jsonl", [{"prompt": f"Prompt {i}"} for i in range(7)])
    first = cli(tmp_path, dataset, MIXED, mock_llm.base_url, "--max_samples=3",
                env={"HERMES_ENGINE": "direct"})
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Beginning flow run" not in first.stderr + first.stdout  # HERMES_ENGINE chose the engine

    mock_llm.reset()
    settings = RunSettings(dataset_file=str(dataset), run_name=MIXED, output_dir=str(tmp_path / "data"),
                           base_url=mock_llm.base_url, model="mock-model", batch_size=2, num_workers=3,
                           max_samples=5, resume=True)
    stats = batch_run(settings=settings)
    assert stats["trajectories_written"] == 5
    assert mock_llm.stats()["requests"] == 2 * 3  # only the two new prompts ran (3 model calls each)

    mock_llm.reset()
    last = cli(tmp_path, dataset, MIXED, mock_llm.base_url, "--engine", "direct", "--resume")
    assert last.returncode == 0, last.stderr[-3000:]
    assert mock_llm.stats()["requests"] == 2 * 3
    entries = read_jsonl(tmp_path / "data" / MIXED / "trajectories.jsonl")
    assert sorted(e["prompt_index"] for e in entries) == list(range(7))  # each prompt exactly once
    assert containers_of(docker_engine, MIXED) == []


def test_direct_run_with_too_many_failures_exits_1_and_keeps_the_outputs(tmp_path, mock_llm):
    rows = [{"prompt": "fine"}] + [{"prompt": f"broken {i} " + script({"error": 500})} for i in range(2)]
    # neither the client nor the run tries a 500 again (the run's requeue waits 1-8 s per retry;
    # tests/run/test_requeue.py covers it)
    done = cli(tmp_path, write_dataset(tmp_path / "p.jsonl", rows), "failing", mock_llm.base_url,
               "--engine=direct", "--sandbox_backend=local", "--max_retries=0", "--prompt_retries=0")
    assert done.returncode == 1
    assert "2 of 3 prompts failed (67%)" in done.stderr and "--resume" in done.stderr
    assert len(read_jsonl(tmp_path / "data" / "failing" / "trajectories.jsonl")) == 1


def test_interrupted_direct_run_removes_its_containers(tmp_path, mock_llm, sandbox_image, docker_engine):
    rows = [{"prompt": f"sleepy {i} " + script(
        {"reasoning": "wait", "tool_calls": [{"name": "terminal", "arguments": {"command": "sleep 300"}}]},
        {"reasoning": "ok", "content": "done"})} for i in range(3)]
    dataset = write_dataset(tmp_path / "p.jsonl", rows)
    cmd = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=3",
           f"--run_name={INTERRUPTED}", f"--base_url={mock_llm.base_url}", "--model=mock-model", "--engine=direct",
           "--sandbox_command_timeout=600"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        until(lambda: len(containers_of(docker_engine, INTERRUPTED)) >= 3 and len(mock_llm.requests()) >= 3,
              "three prompts inside their tool call")
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, output[-3000:]  # 128 + SIGINT, as a shell reports Ctrl-C; a traceback would be 1
    assert "continue with --resume" in output
    assert containers_of(docker_engine, INTERRUPTED) == [], output[-3000:]
