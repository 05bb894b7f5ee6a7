"""The command line's promises, as a user types them: `hermes-batch` (python -m flows.cli) and
`batch_runner.py` as subprocesses, against the bundled model server on loopback.

Runs use `--engine direct` unless Prefect itself is under test (the same run, without booting
Prefect: seconds instead of tens of seconds); sandboxes are real containers on the real engine.
What reached the model is read from the model server's own request log (and, for API keys, from
a loopback hop in front of it that notes each request's Authorization header).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from flows import local_server
from hermes.data import distributions
from hermes.sandbox.base import IMAGE_ENV
from hermes.settings import API_KEY_ENV_VARS
from tests.conftest import containers_of
from tests.helpers import HeaderRecorder, read_jsonl, script, write_dataset

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.docker

ANSWER = {"reasoning": "Nothing to run.", "content": "Answered."}  # a turn that needs no sandbox


def env_without_keys(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in API_KEY_ENV_VARS and k != "HERMES_ENGINE"}
    return {**env, **extra}


def cli(cwd: Path, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env or env_without_keys(),
                          capture_output=True, text=True, timeout=timeout)


def run(cwd: Path, dataset: Path, name: str, base_url: str, *flags: str, env: dict | None = None,
        engine: str = "direct") -> subprocess.CompletedProcess:
    """`hermes-batch run` over `dataset`; no container until a tool call needs one. Most of these
    datasets answer in prose though tools are offered (questions that merely offer tools), so the run
    warns rather than fails on agents that never acted."""
    return cli(cwd, "run", f"--dataset_file={dataset}", "--batch_size=2", f"--run_name={name}",
               f"--base_url={base_url}", "--model=mock-model", "--num_workers=2", f"--engine={engine}",
               "--sandbox_prefetch=false", "--max_no_tool_use_share=1", *flags, env=env)


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def first_human(entry: dict) -> str:
    return next(t["value"] for t in entry["conversations"] if t["from"] == "human")


@pytest.fixture
def llm(mock_llm, sandbox_image, docker_engine):
    mock_llm.reset()
    return mock_llm


# --------------------------------------------------------------------------- status, merge


def test_status_table_and_json_then_merge_rebuilds_the_outputs(tmp_path, llm):
    rows = [{"prompt": "works " + script(ANSWER)}, {"prompt": "works too " + script(ANSWER)},
            {"prompt": "breaks " + script({"error": 400})}]
    dataset = write_dataset(tmp_path / "p.jsonl", rows)
    done = run(tmp_path, dataset, "st", llm.base_url, "--max_retries=0")
    assert done.returncode == 0, done.stderr[-3000:]  # one failed prompt of three: under max_failed_share

    table = ok(cli(tmp_path, "status", "st")).stdout
    assert table.startswith(f"run st ({Path('data') / 'st'})")
    assert re.search(r"prompts in dataset\s+3", table) and re.search(r"done\s+2\s+\(completed 2,", table), table
    assert re.search(r"failed\s+1\s+\(1 failed attempts; retried on --resume\)", table), table
    assert re.search(r"owed\s+1\b", table) and "400" in table, table

    status = json.loads(ok(cli(tmp_path, "status", "st", "--json")).stdout)
    assert (status["run_name"], status["total_prompts"], status["done"], status["completed"]) == ("st", 3, 2, 2)
    assert (status["failed"], status["failed_attempts"], status["owed"], status["active"]) == (1, 1, 1, False)
    # grouped by kind (hermes.data.failures), each with a count and an example message
    assert status["failure_reasons"]["model endpoint 400"]["count"] == 1
    assert status["failure_reasons"]["model endpoint 400"]["example"].startswith("model endpoint answered 400")

    missing = cli(tmp_path, "status", "no-such-run")
    assert missing.returncode == 2 and "no run folder" in missing.stderr

    out = tmp_path / "data" / "st"
    before = sorted(first_human(e) for e in read_jsonl(out / "trajectories.jsonl"))
    (out / "trajectories.jsonl").unlink()
    (out / "statistics.json").unlink()
    merged = ok(cli(tmp_path, "merge", "st")).stdout
    assert re.search(r"trajectories_written\s+2", merged), merged
    assert sorted(first_human(e) for e in read_jsonl(out / "trajectories.jsonl")) == before
    assert json.loads((out / "statistics.json").read_text())["prompts_failed"] == 1
    assert cli(tmp_path, "merge", "no-such-run").returncode == 2


# --------------------------------------------------------------------------- the dataset


def test_skip_bad_lines_runs_the_good_rows_and_names_the_bad_ones(tmp_path, llm):
    dataset = tmp_path / "p.jsonl"
    dataset.write_text(json.dumps({"prompt": "good one " + script(ANSWER)}) + "\n"
                       + "{not json\n"
                       + json.dumps({"prompt": 7}) + "\n"
                       + json.dumps({"prompt": "good two " + script(ANSWER)}) + "\n")
    bad = (f"{dataset}:2: not valid JSON", f"{dataset}:3: field 'prompt': Input should be a valid string")
    refused = run(tmp_path, dataset, "bad", llm.base_url)
    assert refused.returncode == 2 and "2 bad line(s), nothing was run" in refused.stderr, refused.stderr
    assert all(b in refused.stderr for b in bad), refused.stderr
    assert llm.requests() == []  # nothing ran

    done = ok(run(tmp_path, dataset, "bad", llm.base_url, "--skip_bad_lines"))
    said = done.stdout + done.stderr
    assert all(b in said for b in bad), said  # the skipped lines are reported, with line and field
    entries = read_jsonl(tmp_path / "data" / "bad" / "trajectories.jsonl")
    assert sorted(first_human(e).split(" MOCK")[0] for e in entries) == ["good one", "good two"]


# --------------------------------------------------------------------------- what reaches the model


def test_ephemeral_system_prompt_and_prefill_reach_the_model_and_never_the_output(tmp_path, llm):
    ephemeral = f"EPHEMERAL-{secrets.token_hex(4)}: you are terse."
    prefill = [{"role": "user", "content": f"PREFILL-Q-{secrets.token_hex(4)}"},
               {"role": "assistant", "content": f"PREFILL-A-{secrets.token_hex(4)}"}]
    (tmp_path / "prefill.json").write_text(json.dumps(prefill))
    prompt = "the prompt " + script(ANSWER)
    dataset = write_dataset(tmp_path / "p.jsonl", [{"prompt": prompt}])
    ok(run(tmp_path, dataset, "eph", llm.base_url, f"--ephemeral_system_prompt={ephemeral}",
           f"--prefill_messages_file={tmp_path / 'prefill.json'}"))

    (body,) = llm.requests()
    sent = [(m["role"], m["content"]) for m in body["messages"]]
    assert sent[0][0] == "system" and sent[0][1].endswith(ephemeral), sent[0]
    assert sent[1:] == [("user", prefill[0]["content"]), ("assistant", prefill[1]["content"]), ("user", prompt)]

    out = tmp_path / "data" / "eph"
    written = (out / "trajectories.jsonl").read_text() + "".join(p.read_text() for p in out.glob("batch_*.jsonl"))
    assert "Answered." in written  # the trajectory is there ...
    for secret in (ephemeral.split(":")[0], prefill[0]["content"], prefill[1]["content"]):
        assert secret not in written  # ... without the ephemeral prompt or the prefill


def test_reasoning_and_provider_flags_on_the_wire(tmp_path, llm):
    dataset = write_dataset(tmp_path / "p.jsonl", [{"prompt": "wire " + script(ANSWER)}])
    ok(run(tmp_path, dataset, "wire", llm.base_url, "--reasoning_effort=high", "--reasoning_disabled",
           "--providers_ignored=slowco, badco", "--providers_order", "fastco,okco"))
    (body,) = llm.requests()
    assert body["reasoning"] == {"effort": "none"}  # disabled wins over the effort asked
    assert body["provider"] == {"ignore": ["slowco", "badco"], "order": ["fastco", "okco"]}


# --------------------------------------------------------------------------- quality filters, attempts


def test_keep_unreasoned_keeps_what_is_discarded_by_default(tmp_path, llm):
    rows = [{"prompt": "plain " + script({"content": "no reasoning here"})}, {"prompt": "thought " + script(ANSWER)}]
    dataset = write_dataset(tmp_path / "p.jsonl", rows)
    ok(run(tmp_path, dataset, "strict", llm.base_url))
    strict = read_jsonl(tmp_path / "data" / "strict" / "trajectories.jsonl")
    assert [first_human(e).split(" ")[0] for e in strict] == ["thought"]
    assert json.loads((tmp_path / "data" / "strict" / "statistics.json").read_text())["discarded_no_reasoning"] == 1

    ok(run(tmp_path, dataset, "lenient", llm.base_url, "--keep_unreasoned"))
    lenient = read_jsonl(tmp_path / "data" / "lenient" / "trajectories.jsonl")
    assert sorted(first_human(e).split(" ")[0] for e in lenient) == ["plain", "thought"]


def test_max_attempts_gives_up_on_a_prompt_after_that_many_failed_runs(tmp_path, llm):
    rows = [{"prompt": "always fails " + script({"error": 400})}, {"prompt": "fine " + script(ANSWER)}]
    dataset = write_dataset(tmp_path / "p.jsonl", rows)
    flags = ("--max_attempts=2", "--max_retries=0", "--max_failed_share=1")
    ok(run(tmp_path, dataset, "att", llm.base_url, *flags))
    ok(run(tmp_path, dataset, "att", llm.base_url, "--resume", *flags))
    failing_calls = [b for b in llm.requests() if "always fails" in json.dumps(b["messages"])]
    assert len(failing_calls) == 2  # once per run: failed prompts run again on resume

    ok(run(tmp_path, dataset, "att", llm.base_url, "--resume", *flags))  # two failures: given up
    assert len([b for b in llm.requests() if "always fails" in json.dumps(b["messages"])]) == 2
    status = json.loads(ok(cli(tmp_path, "status", "att", "--json")).stdout)
    assert status["failed"] == 1 and status["failed_attempts"] == 2 and status["completed"] == 1


# --------------------------------------------------------------------------- the API key


@pytest.mark.parametrize("given, expected", [
    ({"flag": "k-flag", "HERMES_API_KEY": "k-hermes", "OPENROUTER_API_KEY": "k-or", "OPENAI_API_KEY": "k-oa"}, "k-flag"),
    ({"HERMES_API_KEY": "k-hermes", "OPENROUTER_API_KEY": "k-or", "OPENAI_API_KEY": "k-oa"}, "k-hermes"),
    ({"OPENROUTER_API_KEY": "k-or", "OPENAI_API_KEY": "k-oa"}, "k-or"),
    ({"OPENAI_API_KEY": "k-oa"}, "k-oa"),
], ids=["--api_key", "HERMES_API_KEY", "OPENROUTER_API_KEY", "OPENAI_API_KEY"])
def test_the_api_key_order(tmp_path, llm, given, expected):
    given = dict(given)
    flag = given.pop("flag", None)
    dataset = write_dataset(tmp_path / "p.jsonl", [{"prompt": "key " + script(ANSWER)}])
    with HeaderRecorder(llm.url) as hop:
        ok(run(tmp_path, dataset, "key", hop.base_url, *([f"--api_key={flag}"] if flag else []),
               env=env_without_keys(**given)))
    assert hop.authorizations == [f"Bearer {expected}"] * 2  # the endpoint check's GET /models, the prompt's call


def test_the_api_key_is_never_stored_in_prefect(tmp_path, llm):
    """A Prefect run (the background server of its own PREFECT_HOME, its database there) with
    --api_key: the key reaches the model and appears nowhere in Prefect's home: database, logs, anything."""
    key = f"sk-never-stored-{secrets.token_hex(8)}"
    home = tmp_path / "prefect-home"
    env = env_without_keys(PREFECT_HOME=str(home))
    env.pop("PREFECT_API_URL", None)
    dataset = write_dataset(tmp_path / "p.jsonl", [{"prompt": "secret " + script(ANSWER)}])
    try:
        with HeaderRecorder(llm.url) as hop:
            ok(run(tmp_path, dataset, "pk", hop.base_url, f"--api_key={key}", env=env, engine="prefect"))
    finally:
        local_server.stop(home)  # this home's own server: the session stops only its own
    assert hop.authorizations == [f"Bearer {key}"] * 2  # the endpoint check's GET /models, the prompt's call
    stored = [p for p in home.rglob("*") if p.is_file()]
    assert any(p.suffix == ".db" for p in stored), stored  # the run was recorded in this database
    assert [p for p in stored if key.encode() in p.read_bytes()] == []
    manifest = (tmp_path / "data" / "pk" / "run.json").read_text()
    assert key not in manifest  # nor in the run's own settings file


# --------------------------------------------------------------------------- other commands


def test_list_distributions_both_ways(tmp_path):
    expected = distributions.describe()
    listed = ok(cli(tmp_path, "list-distributions")).stdout
    flag = ok(subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "--list_distributions"], cwd=tmp_path,
                             env=env_without_keys(), capture_output=True, text=True, timeout=120)).stdout
    assert listed == flag
    assert listed.startswith(expected + "\n")  # the table, then which toolsets can run here and why not
    assert re.search(r"^available here: .*terminal", listed, re.M)
    assert re.search(r"^default\s", listed, re.M) and re.search(r"^development\s", listed, re.M)


def test_sandbox_build_makes_a_working_image_offline(tmp_path, docker_engine):
    tag = f"hermes-test-build:{secrets.token_hex(4)}"
    try:  # the busybox recipe (a second); the Debian one is the default image's, built once per machine
        done = ok(cli(tmp_path, "sandbox", "build", "--recipe", "busybox", "--tag", tag))
        assert done.stdout.startswith(f"{tag} sha256:") and " built in " in done.stdout, done.stdout
        said = docker_engine.containers.run(tag, ["sh", "-c", "echo $((6 * 7)); ls /bin | grep -c ."],
                                            network_mode="none", remove=True).decode().split()
        assert said[0] == "42" and int(said[1]) > 50, said  # a shell and the usual command-line tools
    finally:
        docker_engine.images.remove(tag, force=True)


def test_demo_runs_the_whole_job_on_embedded_defaults(tmp_path, default_image, docker_engine):
    name = f"demo-test-{secrets.token_hex(3)}"
    env = env_without_keys()  # the session's PREFECT_HOME: its background server, as a user's second run finds it
    env.pop("PREFECT_API_URL", None)
    env.pop(IMAGE_ENV, None)  # the product's own default image, as a user's demo gets it
    done = ok(cli(tmp_path, "demo", "--run_name", name, env=env))
    assert "bundled model server: http://127.0.0.1:" in done.stdout
    assert "Prefect UI: http://127.0.0.1:" in done.stdout  # the session's background server, shown once
    demo_rows = read_jsonl(ROOT / "deployments" / "demo" / "prompts.jsonl")
    entries = read_jsonl(tmp_path / "data" / name / "trajectories.jsonl")
    assert sorted(first_human(e) for e in entries) == sorted(r["prompt"] for r in demo_rows)
    assert all(e["completed"] for e in entries)
    assert f"sandbox image: {default_image}" in done.stdout
    # the Python prompt ran its script with the image's python3
    python = next(e for e in entries if "Python function" in first_human(e))
    assert "add(2, 3) = 5" in json.dumps(python["conversations"]) and "Python 3." in json.dumps(python["conversations"])
    assert f"trajectories: {Path('data') / name / 'trajectories.jsonl'}" in done.stdout
    # it ends with a short summary: only the tools the demo called, and the command that shows the run
    assert f"look at it:   hermes-batch view {name}" in done.stdout
    assert "Tools used:" in done.stdout and "browser_click" not in done.stdout
    assert containers_of(docker_engine, name) == []
