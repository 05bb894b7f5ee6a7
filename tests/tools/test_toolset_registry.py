"""The toolset extension point: a toolset is one module that registers itself.

tests/example_toolset.py is such a module (not shipped). Runs load it through
HERMES_TOOLSET_MODULES, as a user's own toolset would be loaded.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes.data import distributions
from hermes.tools import TOOLS, ToolContext, needs_sandbox, openai_schemas, run_tool, tools_for
from hermes.tools.registry import RegistryError, Tool, Toolset, register, unregister
from tests.helpers import unique_run, read_jsonl, script, tool_responses, write_dataset

ECHO_RUN = unique_run("echo-run")  # its containers' label: unique on a shared engine
TERM_RUN = unique_run("term-run")  # its containers' label: unique on a shared engine

ROOT = Path(__file__).resolve().parents[2]


def _echo_call(name: str, text: str, sleep: float = 0) -> dict:
    return {"name": name, "arguments": {"text": text, "sleep": sleep}}


def run_cli(tmp_path: Path, rows: list[dict], run_name: str, base_url: str, *extra: str,
            env: dict | None = None) -> subprocess.CompletedProcess:
    dataset = write_dataset(tmp_path / f"{run_name}.jsonl", rows)
    cmd = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=2",
           f"--run_name={run_name}", f"--base_url={base_url}", "--model=mock-model", "--num_workers=3",
           "--engine=direct", *extra]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HERMES_TOOLSET_MODULES": "tests.example_toolset",
                               "ECHO_TOKEN": "t0ken", **(env or {})})


def containers_created(client, run_name: str, since: float) -> int:
    """Containers the engine created for this run (its event log: nothing escapes it, removed or not)."""
    events = client.api.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                               filters={"type": "container", "event": "create", "label": f"hermes-batch.run={run_name}"})
    return sum(1 for _ in events)


# --------------------------------------------------------------------------- in process

def test_a_registered_toolset_is_found_everywhere_and_leaves_cleanly():
    def shout(ctx, args):
        return {"said": args["word"].upper(), "settings": ctx.settings}

    ts = register(Toolset(name="shout", needs_sandbox=False, tools=[
        Tool(name="shout", description="Shout.", run=shout,
             parameters={"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]})]))
    try:
        assert TOOLS["shout"].toolset == "shout" and TOOLS["shout"].needs_sandbox is False
        assert [t.name for t in tools_for(["shout", "terminal"])] == ["terminal", "process", "shout"]
        assert not needs_sandbox(tools_for(["shout"])) and needs_sandbox(tools_for(["shout", "file"]))
        assert openai_schemas(tools_for(["shout"]))[0]["function"]["name"] == "shout"
        # no sandbox: a sandbox-free tool runs; a sandbox tool says clearly that there is none
        assert json.loads(run_tool("shout", '{"word": "hi"}', ToolContext())) == {"said": "HI", "settings": None}
        assert "needs a sandbox" in json.loads(run_tool("terminal", '{"command": "true"}', ToolContext()))["error"]
        assert "Missing required parameter 'word'" in json.loads(run_tool("shout", "{}", ToolContext()))["error"]
        with pytest.raises(RegistryError, match="already registered"):
            register(Toolset(name="other", tools=[Tool(name="shout", description="", parameters={}, run=shout)]))
        with pytest.raises(RegistryError, match="registered twice"):
            register(Toolset(name="shout", tools=[]))
    finally:
        unregister(ts.name)
    assert "shout" not in TOOLS
    assert json.loads(run_tool("shout", "{}", ToolContext())) == {"error": "Unknown tool: shout"}


def test_a_tool_the_conversation_was_not_offered_is_refused(tmp_path, mock_llm):
    """A web-only prompt whose model calls `terminal` anyway gets no sandbox and no command run."""
    rows = [{"prompt": "sneaky " + script(
        {"reasoning": "Try the shell.", "tool_calls": [{"name": "terminal", "arguments": {"command": "id"}},
                                                      _echo_call("echo", "fine")]},
        {"reasoning": "Done.", "content": "Ok."})}]
    done = run_cli(tmp_path, rows, "sneaky", mock_llm.base_url, "--distribution=echo_only")
    assert done.returncode == 0, done.stderr[-3000:]
    (entry,) = read_jsonl(tmp_path / "data" / "sneaky" / "trajectories.jsonl")
    terminal, echo = tool_responses(entry)
    assert terminal["content"] == {"error": "Unknown tool: terminal"}
    assert echo["content"]["echo"] == "fine"
    assert entry["tool_stats"]["terminal"] == {"count": 1, "success": 0, "failure": 1}


def test_bad_distribution_registration_is_refused():
    with pytest.raises(distributions.DistributionError, match="already exists"):
        distributions.register("default", {"terminal": 100})
    with pytest.raises(distributions.DistributionError, match="integer percents"):
        distributions.register("nope", {"terminal": 150})


# --------------------------------------------------------------------------- end to end

def test_an_example_toolset_runs_end_to_end_with_its_settings_and_no_container(tmp_path, mock_llm, docker_engine):
    """A run whose toolsets need no sandbox makes no container; the terminal control run makes one per prompt."""
    rows = [{"prompt": f"echo {i} " + script(
        {"reasoning": "Echo it.", "tool_calls": [_echo_call("echo", f"hello {i}")]},
        {"reasoning": "Done.", "content": "Echoed."})} for i in range(4)]
    t0 = time.time()
    done = run_cli(tmp_path, rows, ECHO_RUN, mock_llm.base_url, "--distribution=echo_only", "--echo_prefix=>> ")
    assert done.returncode == 0, done.stderr[-3000:]
    assert containers_created(docker_engine, ECHO_RUN, t0) == 0

    out = tmp_path / "data" / ECHO_RUN
    entries = read_jsonl(out / "trajectories.jsonl")
    assert len(entries) == 4
    for entry in entries:
        assert entry["toolsets_used"] == ["echo"]
        (response,) = tool_responses(entry)
        assert response["name"] == "echo" and response["content"]["echo"].startswith(">> hello ")
        assert response["content"]["token_seen"] is True  # the secret came from the environment
        assert entry["tool_stats"]["echo"] == {"count": 1, "success": 1, "failure": 0}
        assert "terminal" in entry["tool_stats"]  # every tool the system has, zeros included
    stats = json.loads((out / "statistics.json").read_text())
    assert stats["tool_statistics"]["echo"]["count"] == 4

    # the control: the same counting sees the containers of a run whose prompts use the terminal
    rows = [{"prompt": f"term {i} " + script(
        {"reasoning": "Look.", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo in-box"}}]},
        {"reasoning": "Done.", "content": "Seen."})} for i in range(2)]
    t0 = time.time()
    done = run_cli(tmp_path, rows, TERM_RUN, mock_llm.base_url, "--distribution=terminal_only")
    assert done.returncode == 0, done.stderr[-3000:]
    assert containers_created(docker_engine, TERM_RUN, t0) >= 2  # one per prompt (plus the limit probe)


def test_an_unavailable_toolset_is_left_out_loudly(tmp_path, mock_llm):
    rows = [{"prompt": "anything"}]
    done = run_cli(tmp_path, rows, "no-token", mock_llm.base_url, "--distribution=echo_only", env={"ECHO_TOKEN": ""})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]  # refused, not crashed
    assert "echo (ECHO_TOKEN is not set)" in done.stderr
    listing = subprocess.run([sys.executable, "-m", "flows.cli", "list-distributions"], capture_output=True, text=True,
                             cwd=ROOT, env={**os.environ, "HERMES_TOOLSET_MODULES": "tests.example_toolset",
                                            "ECHO_TOKEN": ""}, timeout=120)
    assert "not available: echo: ECHO_TOKEN is not set" in listing.stdout
    assert "echo_only" in listing.stdout


def test_parallel_tool_calls_of_one_turn_overlap_and_exclusive_ones_do_not(tmp_path, mock_llm):
    rows = [{"prompt": "parallel " + script(
        {"reasoning": "Three at once.", "tool_calls": [_echo_call("echo", f"p{i}", 1) for i in range(3)]},
        {"reasoning": "Now alone.", "tool_calls": [_echo_call("echo", "a", 0.5), _echo_call("echo_alone", "b", 0.5),
                                                   _echo_call("echo", "c", 0.5)]},
        {"reasoning": "Done.", "content": "All echoed."})}]
    done = run_cli(tmp_path, rows, "parallel", mock_llm.base_url, "--distribution=echo_only")
    assert done.returncode == 0, done.stderr[-3000:]
    (entry,) = read_jsonl(tmp_path / "data" / "parallel" / "trajectories.jsonl")
    responses = tool_responses(entry)
    # results come back in call order, each matched to its own call
    assert [r["content"]["echo"] for r in responses] == ["p0", "p1", "p2", "a", "b", "c"]
    assert [r["content"]["call_id"] for r in responses] == [r["tool_call_id"] for r in responses]
    first = [r["content"] for r in responses[:3]]
    # all three were running at one moment: the latest start came before the earliest end
    assert max(c["started"] for c in first) < min(c["ended"] for c in first)
    a, b, c = (r["content"] for r in responses[3:])
    # the exclusive call ran alone: after the call before it, before the call after it
    assert a["ended"] <= b["started"] and b["ended"] <= c["started"]
    assert entry["api_calls"] == 3


def test_at_most_four_tool_calls_of_one_turn_run_at_once(tmp_path, mock_llm):
    rows = [{"prompt": "many " + script(
        {"reasoning": "Seven at once.", "tool_calls": [_echo_call("echo", f"m{i}", 1) for i in range(7)]},
        {"reasoning": "Done.", "content": "All echoed."})}]
    done = run_cli(tmp_path, rows, "many", mock_llm.base_url, "--distribution=echo_only")
    assert done.returncode == 0, done.stderr[-3000:]
    (entry,) = read_jsonl(tmp_path / "data" / "many" / "trajectories.jsonl")
    calls = [r["content"] for r in tool_responses(entry)]
    assert [c["echo"] for c in calls] == [f"m{i}" for i in range(7)]
    # how many were running at each call's start: never more than four, and four at the peak
    running = [sum(1 for o in calls if o["started"] <= c["started"] < o["ended"]) for c in calls]
    assert max(running) == 4, running


def test_toolset_keys_come_from_prefect_secret_blocks_not_parameters(prefect_harness, monkeypatch, tmp_path, mock_llm):
    """A deployment names the Secret block holding a toolset's key; the key reaches the toolset's
    backend from a flow run and is never a flow parameter Prefect stores."""
    from prefect import get_client
    from prefect.blocks.system import Secret
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from flows.batch import batch_run
    from hermes.settings import RunSettings
    from tests.helpers import unique_run
    from tests.tools.test_web_tools import Provider

    Secret(value="tv-123-secret").save("tavily-key-test", overwrite=True)
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    tavily = Provider({("POST", "/search"): lambda r: (200, {"query": r["json"]["query"], "results": [
        {"title": "Axolotl facts", "url": "https://a.example/facts", "content": "Axolotls are neotenic."}]})})
    rows = [{"prompt": "look it up " + script(
        {"reasoning": "Search.", "tool_calls": [{"name": "web_search", "arguments": {"query": "axolotl"}}]},
        {"reasoning": "Done.", "content": "Found."})}]
    name = unique_run("secret-block")
    settings = RunSettings(dataset_file=str(write_dataset(tmp_path / "d.jsonl", rows)), run_name=name,
                           output_dir=str(tmp_path / "data"), base_url=mock_llm.base_url, model="mock-model",
                           batch_size=1, distribution="minimal", web_allow_hosts="127.0.0.1",
                           tools={"web": {"search_backend": "tavily", "extract_backend": "none",
                                          "tavily_base_url": tavily.url}})
    try:
        stats = batch_run(settings=settings, tool_secrets={"TAVILY_API_KEY": "tavily-key-test"})
    finally:  # not monkeypatch: it would put the loaded key back at teardown, for every later test
        os.environ.pop("TAVILY_API_KEY", None)
        tavily.close()
    assert stats["trajectories_written"] == 1
    (entry,) = read_jsonl(tmp_path / "data" / name / "trajectories.jsonl")
    assert tool_responses(entry)[0]["content"]["success"] is True
    assert [r["headers"]["Authorization"] for r in tavily.requests] == ["Bearer tv-123-secret"]
    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[f"batch-{name}"])))
    stored = json.dumps(run.parameters)
    assert "tavily-key-test" in stored and "tv-123-secret" not in stored  # the block's name, never its value
