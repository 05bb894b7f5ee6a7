"""Runs against a server that writes its tool calls as text (mockllm --tool-calls), and against one
whose model never calls a tool: what a user of an open model without a tool parser meets.

Each run is real: the bundled mock server on loopback, Docker sandboxes, the run's journal, merge.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from hermes.run import direct
from hermes.run.summary import format_summary
from hermes.run.tool_use import AgentsNeverActed
from hermes.settings import RunSettings
from mockllm import MockLLM
from tests.helpers import read_jsonl, script, unique_run, write_dataset

TEXT_MODES = ("hermes", "json", "llama", "mistral", "qwen3_coder")


def call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


#: answers that come out the same in every run (no hostnames, no times): prose around calls, parallel calls
PROMPTS = [
    "Set up notes. " + script(
        {"reasoning": "Write, then look.", "content": "Let me set up the notes first.",
         "tool_calls": [call("write_file", path="notes.txt", content="alpha\nbeta\n"),
                        call("terminal", command="wc -l notes.txt")]},
        {"reasoning": "Read it back.", "tool_calls": [call("read_file", path="notes.txt")]},
        {"reasoning": "All there.", "content": "notes.txt holds alpha and beta."}),
    "Count. " + script(
        {"reasoning": "Shell arithmetic.", "tool_calls": [call("terminal", command="echo $((6*7))")]},
        {"reasoning": "Got it.", "content": "It is 42."}),
    "Nothing to do. " + script({"reasoning": "No tool needed.", "content": "Hello!"}),
]


def run(tmp_path: Path, mode: str, prompts: list[str], image: str, **kw):
    dataset = write_dataset(tmp_path / f"{mode}.jsonl", [{"prompt": p} for p in prompts])
    name = unique_run(f"text-{mode}".replace("_", "-"))
    with MockLLM(tool_calls=mode) as llm:
        settings = RunSettings(dataset_file=str(dataset), run_name=name, output_dir=str(tmp_path / "data"),
                               base_url=llm.base_url, model="mock-model", batch_size=2, num_workers=3,
                               distribution="terminal_only", **kw)
        return settings, direct.run(settings, api_key="test")


def trajectories(settings: RunSettings) -> list[dict]:
    """The run's trajectories, call ids named by their order (an id is opaque: the server's own when it
    sent native calls, generated where they were recovered from text)."""
    out = []
    for entry in sorted(read_jsonl(Path(settings.output_dir) / settings.run_name / "trajectories.jsonl"),
                        key=lambda e: e["prompt_index"]):
        text = json.dumps(entry, sort_keys=True)
        ids = list(dict.fromkeys(re.findall(r'\\"tool_call_id\\": \\"([^"\\]+)\\"', text)))
        for i, found in enumerate(ids):
            text = text.replace(found, f"ID{i}")
        entry = json.loads(text)
        entry["metadata"].pop("timestamp")
        out.append(entry)
    return out


def hermes_blocks(settings: RunSettings) -> dict[int, dict]:
    run_dir = Path(settings.output_dir) / settings.run_name
    return {e["prompt_index"]: e["hermes"] for path in sorted(run_dir.glob("batch_*.jsonl")) for e in read_jsonl(path)}


@pytest.mark.usefixtures("docker_engine")
def test_calls_written_as_text_make_the_same_trajectories_as_native_calls(tmp_path, sandbox_image):
    native_settings, native = run(tmp_path, "native", PROMPTS, sandbox_image)
    expected = trajectories(native_settings)
    assert native["tool_use"]["calls_by_format"] == {"native": 4}
    assert [r["content"]["output"] for e in expected for r in _responses(e) if r["name"] == "terminal"] == \
        ["2 notes.txt\n", "42\n"]  # the tools really ran
    for mode in TEXT_MODES:
        settings, stats = run(tmp_path, mode, PROMPTS, sandbox_image)
        assert trajectories(settings) == expected, mode
        assert stats["tool_statistics"] == native["tool_statistics"]
        assert stats["tool_use"] == {**native["tool_use"], "calls_by_format": {mode: 4}}
        blocks = hermes_blocks(settings)
        assert blocks[0]["tool_calls_by_format"] == {mode: 3} and blocks[1]["tool_calls_by_format"] == {mode: 1}
        assert blocks[2].get("no_tool_use") is True  # offered tools, answered without one
    assert native["tool_use"]["prompts_no_tool_use"] == 1 and native["tool_use"]["warning"] is None


def _responses(entry: dict) -> list[dict]:
    return [json.loads(b) for t in entry["conversations"] if t["from"] == "tool"
            for b in re.findall(r"<tool_response>\n(.*?)\n</tool_response>", t["value"], re.S)]


@pytest.mark.usefixtures("docker_engine")
def test_an_explicit_parser_reads_its_format(tmp_path, sandbox_image):
    settings, stats = run(tmp_path, "mistral", PROMPTS[1:2], sandbox_image, tool_call_parser="mistral")
    assert stats["tool_use"]["calls_by_format"] == {"mistral": 1}
    with pytest.raises(AgentsNeverActed) as raised:  # native reads no text calls: the one agent never acted
        run(tmp_path, "hermes", PROMPTS[1:2], sandbox_image, tool_call_parser="native")
    stats = raised.value.stats
    assert stats["tool_use"]["calls_by_format"] == {} and stats["tool_use"]["prompts_no_tool_use"] == 1


NEVER = [f"Task {i}: list the files. " + script({"reasoning": "r", "tool_calls": [call("terminal", command="ls")]})
         for i in range(3)]


@pytest.mark.usefixtures("docker_engine")
def test_a_run_whose_agents_never_acted_ends_failed_by_default(tmp_path, sandbox_image):
    with pytest.raises(AgentsNeverActed) as raised:
        run(tmp_path, "never", NEVER, sandbox_image)  # the default max_no_tool_use_share, 0.9
    assert "3 of 3 prompts offered tools never called one" in str(raised.value)
    assert "max_no_tool_use_share=0.9" in str(raised.value)
    assert raised.value.stats["tool_use"]["prompts_acted"] == 0  # outputs written, statistics with them


@pytest.mark.usefixtures("prefect_harness", "docker_engine")
def test_a_run_whose_agents_never_acted_says_so_everywhere(tmp_path, sandbox_image):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.batch import batch_run
    from tasks.report import artifact_key

    dataset = write_dataset(tmp_path / "never.jsonl", [{"prompt": p} for p in NEVER])
    name = unique_run("never-acted")
    # the log, read at its logger: where its handlers write (the terminal, a file, Prefect's API) depends
    # on what configured logging earlier in this worker process
    logged = []
    catcher = logging.Handler(logging.WARNING)
    catcher.emit = lambda record: logged.append((record.levelname, record.getMessage()))
    logging.getLogger("hermes.run.tool_use").addHandler(catcher)
    try:
        with MockLLM(tool_calls="never") as llm:
            settings = RunSettings(dataset_file=str(dataset), run_name=name, output_dir=str(tmp_path / "data"),
                                   base_url=llm.base_url, model="mock-model", batch_size=2, num_workers=3,
                                   distribution="terminal_only",
                                   max_no_tool_use_share=1)  # warn only: questions that merely offer tools
            stats = batch_run(settings=settings)
    finally:
        logging.getLogger("hermes.run.tool_use").removeHandler(catcher)

    written = json.loads((Path(settings.output_dir) / name / "statistics.json").read_text())
    block = written["tool_use"]
    assert (block["prompts_offered_tools"], block["prompts_acted"], block["no_tool_use_share"]) == (3, 0, 1.0)
    assert "--tool_call_parser" in block["warning"] and "--enable-auto-tool-choice" in block["warning"]
    assert stats["trajectories_written"] == 3  # each prompt "completed": only the warning tells

    summary = format_summary(stats, settings.output_dir)
    assert "WARNING: 3 of 3 prompts offered tools never called one" in summary
    assert any(level == "WARNING" and text.startswith("3 of 3 prompts offered tools never called one")
               for level, text in logged), logged  # the log

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["summary-" + artifact_key(name)])))
    assert "Warning: the agents never acted." in found[0].data
    assert "WARNING: 3 of 3 prompts offered tools never called one" in found[0].data
