"""End to end: the real batch-run flow on Prefect, real containers, a real model server on loopback."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from hermes.settings import RunSettings
from tests.conftest import containers_of
from tests.helpers import BROWSER_TOOLS, script, write_dataset, read_jsonl, tool_responses, unique_run, unpullable_image, until

ROOT = Path(__file__).resolve().parents[2]
E2E, MIXED, CLI = unique_run("e2e"), unique_run("mixed"), unique_run("cli")  # their containers' label


@pytest.fixture
def run_settings(tmp_path, mock_llm, sandbox_image):
    def make(dataset: Path, run_name: str, **kw) -> RunSettings:
        return RunSettings(dataset_file=str(dataset), run_name=run_name, output_dir=str(tmp_path / "data"),
                           base_url=mock_llm.base_url, model="mock-model",
                           **{"batch_size": 3, "num_workers": 4, **kw})
    return make


@pytest.mark.usefixtures("prefect_harness")
def test_ten_prompts_each_in_its_own_container(tmp_path, run_settings, docker_engine, mock_llm):
    from flows.batch import batch_run

    prompts = [f"Task {i}: note a token and report the hostname." for i in range(9)]
    prompts.append("Custom: run two commands. " + script(
        {"reasoning": "Check identity and cwd.", "tool_calls": [
            {"name": "terminal", "arguments": {"command": "id -u; pwd"}},
            {"name": "write_file", "arguments": {"path": "out.txt", "content": "hello from the sandbox"}}]},
        {"reasoning": "Read it back.", "tool_calls": [{"name": "read_file", "arguments": {"path": "out.txt"}}]},
        {"reasoning": "All good.", "content": "Finished."}))
    rows = [{"prompt": p, "source": "e2e"} for p in prompts]
    rows[-1]["cwd"] = "/workspace/project"
    dataset = write_dataset(tmp_path / "prompts.jsonl", rows)
    settings = run_settings(dataset, E2E)

    seen_live: set[str] = set()
    stop = threading.Event()

    def watch():  # containers must exist while prompts run
        while not stop.is_set():
            seen_live.update(c.id for c in containers_of(docker_engine, E2E))
            stop.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        stats = batch_run(settings=settings)
    finally:
        stop.set()
        watcher.join()

    out = Path(settings.output_dir) / E2E
    entries = read_jsonl(out / "trajectories.jsonl")
    humans = [e["conversations"][1]["value"] for e in entries]
    assert sorted(humans) == sorted(prompts)  # every prompt exactly once
    assert sorted(e["prompt_index"] for e in entries) == list(range(10))

    hostnames = set()
    for e in entries:
        conv = e["conversations"]
        assert [t["from"] for t in conv[:2]] == ["system", "human"]
        assert conv[0]["value"].startswith("You are a function calling AI model.")
        assert "<tools>\n" in conv[0]["value"]
        gpt_turns = [t["value"] for t in conv if t["from"] == "gpt"]
        assert gpt_turns and all(v.startswith("<think>\n") for v in gpt_turns)
        assert e["completed"] is True and e["partial"] is False
        assert e["metadata"]["source"] == "e2e" and e["metadata"]["model"] == "mock-model"
        assert set(e["tool_stats"]) == {"terminal", "process", "read_file", "write_file", "patch", "search_files",
                                        "web_search", "web_extract", "vision_analyze", "image_generate",
                                        *BROWSER_TOOLS}
        responses = {r["name"]: r["content"] for r in tool_responses(e)}
        if e["prompt_index"] < 9:
            # The token written by write_file comes back through read_file: same container.
            token = re.search(r"token ([0-9a-f]{8})", json.dumps(e["conversations"][2]["value"])).group(1)
            assert f"token {token}" in responses["read_file"]["content"]
            hostnames.add(responses["terminal"]["output"].strip())
            assert e["api_calls"] == 3
            assert e["tool_stats"]["write_file"] == {"count": 1, "success": 1, "failure": 0}
        else:
            assert responses["terminal"]["output"].split() == ["65534", "/workspace/project"]
            assert "hello from the sandbox" in responses["read_file"]["content"]
    assert len(hostnames) == 9  # nine prompts, nine different containers

    assert len(seen_live) >= 2, "containers should exist while the prompts run"
    assert containers_of(docker_engine, E2E) == []  # and none remain

    assert stats["trajectories_written"] == 10 and stats["prompts_failed"] == 0
    on_disk = json.loads((out / "statistics.json").read_text())
    for key in ("run_name", "distribution", "total_prompts", "total_batches", "batch_size", "model",
                "completed_at", "duration_seconds", "tool_statistics", "reasoning_statistics"):
        assert key in on_disk
    assert on_disk["total_prompts"] == 10 and on_disk["total_batches"] == 4
    assert on_disk["tool_statistics"]["read_file"]["count"] == 10
    assert on_disk["reasoning_statistics"]["turns_without_reasoning"] == 0
    checkpoint = json.loads((out / "checkpoint.json").read_text())
    assert checkpoint["completed_prompts"] == list(range(10))
    assert sum(b["processed"] for b in checkpoint["batch_stats"].values()) == 10
    assert sorted(p.name for p in out.glob("batch_*.jsonl")) == [f"batch_{i}.jsonl" for i in range(4)]


@pytest.mark.usefixtures("prefect_harness")
def test_failing_and_unavailable_prompts_do_not_stop_the_run(tmp_path, run_settings, docker_engine):
    from flows.batch import batch_run

    missing_image = unpullable_image("never-built")  # a closed registry on loopback: no public registry is asked
    rows = [{"prompt": "fine"},
            {"prompt": "broken model " + script({"error": 500})},
            {"prompt": "needs an image", "image": missing_image},
            {"prompt": "no reasoning " + script({"content": "plain answer"})},
            {"prompt": "hallucinates " + script(
                {"reasoning": "try", "tool_calls": [{"name": "web_fetch_imaginary", "arguments": {}}]},
                {"reasoning": "ok", "content": "done"})}]
    # the 500 is retried by the client once, then by the run twice (each a fresh attempt of the prompt)
    settings = run_settings(write_dataset(tmp_path / "p.jsonl", rows), MIXED, batch_size=5, max_retries=1,
                            prompt_retries=2)
    settings.sandbox.pull_timeout = 5
    stats = batch_run(settings=settings)
    entries = read_jsonl(Path(settings.output_dir) / MIXED / "trajectories.jsonl")
    assert [e["conversations"][1]["value"] for e in entries] == ["fine"]
    assert stats["prompts_failed"] == 2
    reasons = stats["failure_reasons"]
    assert set(reasons) == {"image unavailable", "model endpoint 500"}
    assert reasons["image unavailable"]["example"].startswith(f"image not available: {missing_image}")
    # the 500 is transient and went back in the queue (twice, here); the missing image is permanent
    retried = stats["retries"]["reasons"]
    assert retried["model endpoint 500"]["count"] == 2 and "image unavailable" not in retried
    assert stats["discarded_no_reasoning"] == 1
    assert stats["dropped_hallucinated_tools"] == 1
    assert containers_of(docker_engine, MIXED) == []


def test_batch_runner_cli_drop_in(tmp_path, mock_llm, sandbox_image, docker_engine):
    """The reference command line, as a user types it, against an OpenAI-compatible server."""
    dataset = write_dataset(tmp_path / "prompts.jsonl", [{"prompt": f"Prompt {i}"} for i in range(6)])
    cmd = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size", "5",
           "--run_name", CLI, "--base_url", mock_llm.base_url, "--model=mock-model", "--num_workers", "8",
           "--reasoning_effort", "high", "--providers_allowed=anthropic,openai", "--provider_sort", "price"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "data" / CLI
    assert len(read_jsonl(out / "trajectories.jsonl")) == 6
    assert {"trajectories.jsonl", "batch_0.jsonl", "batch_1.jsonl", "checkpoint.json", "statistics.json"} <= {
        p.name for p in out.iterdir()}
    assert str(out.relative_to(tmp_path) / "trajectories.jsonl") in done.stdout
    sent = httpx.get(mock_llm.base_url.removesuffix("/v1") + "/_mock/requests").json()
    bodies = sent["requests"] if isinstance(sent, dict) else sent
    assert bodies and all(b["reasoning"] == {"enabled": True, "effort": "high"} for b in bodies)
    assert all(b["provider"] == {"only": ["anthropic", "openai"], "sort": "price"} for b in bodies)
    assert containers_of(docker_engine, CLI) == []

    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 2
    assert "--resume" in again.stderr and "already has results" in again.stderr


@pytest.mark.usefixtures("prefect_harness")
def test_num_workers_bounds_prompts_in_flight_across_batches(tmp_path, run_settings, mock_llm):
    from flows.batch import batch_run

    rows = [{"prompt": f"slow {i} " + script({"sleep": 1.0, "reasoning": "r", "content": "ok"})} for i in range(9)]
    settings = run_settings(write_dataset(tmp_path / "p.jsonl", rows), "bounded", batch_size=2, num_workers=3,
                            max_no_tool_use_share=1)  # prose-only answers: questions that merely offer tools
    stats = batch_run(settings=settings)
    assert stats["trajectories_written"] == 9
    # What the server saw: never more than three prompts' calls at once, though batches are of two
    # (the bound is run-wide), and calls of different prompts did overlap (the run is concurrent).
    # How many overlapped at the peak depends on how fast the machine starts them: not asserted.
    seen = mock_llm.stats()
    assert seen["requests"] == 9 and 2 <= seen["max_in_flight"] <= 3, seen


def test_inline_batches_run_without_a_task_run_each(tmp_path, run_settings, mock_llm):
    """--inline_batches (off by default): the same run, its batches not task runs."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from flows.batch import batch_run

    rows = [{"prompt": f"inline {i}"} for i in range(6)]
    name = unique_run("inline")
    settings = run_settings(write_dataset(tmp_path / "p.jsonl", rows), name, batch_size=2, inline_batches=True)
    assert batch_run(settings=settings)["trajectories_written"] == 6

    def names() -> list[str]:
        # the server records task runs in the background (a flush a second): read until all are in
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[f"batch-{name}"])))
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [runs[0].id]}))
        return sorted(t.name.rsplit("-", 1)[0] for t in tasks)

    until(lambda: "publish-report" in names() and "merge-run" in names(), "the run's task runs to be recorded", 60)
    assert names() == ["merge-run", "plan-run", "publish-report"]


@pytest.mark.usefixtures("prefect_harness")
def test_a_concurrency_limit_on_the_runs_tag_holds_its_batches_to_it(tmp_path, run_settings, mock_llm):
    """README: `prefect concurrency-limit create run:<run_name> 1` lets one batch of that run run at
    a time (the others wait for the slot); --num_workers alone would run them together."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from flows.batch import batch_run

    name = unique_run("limited")
    rows = [{"prompt": f"slow {i} " + script({"sleep": 1.0, "reasoning": "r", "content": "ok"})} for i in range(6)]
    settings = run_settings(write_dataset(tmp_path / "p.jsonl", rows), name, batch_size=2, num_workers=6,
                            max_no_tool_use_share=1)  # prose-only answers: questions that merely offer tools
    with get_client(sync_client=True) as client:
        client.create_concurrency_limit(tag=f"run:{name}", concurrency_limit=1)
    try:
        assert batch_run(settings=settings)["trajectories_written"] == 6
    finally:
        with get_client(sync_client=True) as client:
            client.delete_concurrency_limit_by_tag(f"run:{name}")

    def batches() -> list:
        with get_client(sync_client=True) as client:
            (run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[f"batch-{name}"])))
            found = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [run.id]}))
        return [t for t in found if t.name.startswith("batch-") and t.end_time is not None]

    ran = sorted(until(lambda: len(b := batches()) == 3 and b, "the batches' task runs to be recorded", 60),
                 key=lambda t: t.start_time)
    for before, after in zip(ran, ran[1:]):  # one at a time: each started once the one before had ended
        assert after.start_time >= before.end_time, [(t.name, t.start_time, t.end_time) for t in ran]
