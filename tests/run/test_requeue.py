"""Transient failures are retried within the run; failures and retries are reported by kind.

A real run (the Prefect flow, the official openai SDK against the bundled model server on
loopback, local sandboxes): the server answers 429 to the first requests of every prompt and
500 to some later ones, more often than the client's own retries absorb.
"""
from __future__ import annotations

import json

import pytest

from hermes.data import journal
from hermes.data.failures import classify, group
from hermes.settings import RunSettings
from hermes.run.status import format_status, run_status
from mockllm import MockLLM
from tests.helpers import read_jsonl, script, write_dataset

TERMINAL = {"name": "terminal", "arguments": {"command": "echo hi"}}


@pytest.mark.usefixtures("prefect_harness")
def test_prompts_that_fail_for_transient_reasons_all_complete_in_one_invocation(tmp_path):
    from flows.batch import batch_run

    steady = script({"reasoning": "look", "tool_calls": [TERMINAL]}, {"reasoning": "seen", "content": "done"})
    # turn 1 answers 500 twice: the client's one retry does not absorb it, the prompt fails once more
    shaky = script({"reasoning": "look", "tool_calls": [TERMINAL]},
                   {"error": 500, "times": 2, "reasoning": "seen", "content": "done"})
    rows = [{"prompt": f"steady {i} {steady}"} for i in range(3)] + [{"prompt": f"shaky {i} {shaky}"} for i in range(3)]
    # the first two requests of every prompt are answered 429: the client's first try and its one retry
    with MockLLM(fail_first=2, error_status=429, retry_after=0.2) as server:
        settings = RunSettings(dataset_file=str(write_dataset(tmp_path / "d.jsonl", rows)), run_name="shaky",
                               output_dir=str(tmp_path / "data"), base_url=server.base_url, model="m",
                               batch_size=4, num_workers=6, max_retries=1, distribution="terminal_only",
                               sandbox={"backend": "local"})
        stats = batch_run(settings=settings)

    # every prompt completed, in this one invocation
    assert (stats["prompts_completed"], stats["prompts_failed"], stats["trajectories_written"]) == (6, 0, 6)
    assert stats["failure_reasons"] == {}
    written = read_jsonl(tmp_path / "data" / "shaky" / "trajectories.jsonl")
    assert sorted(e["conversations"][1]["value"] for e in written) == sorted(r["prompt"] for r in rows)
    # the statistics count the retries, and say why
    retries = stats["retries"]
    assert (retries["prompts_retried"], retries["prompts_recovered"], retries["attempts_retried"]) == (6, 6, 9)
    assert {k: g["count"] for k, g in retries["reasons"].items()} == {"model endpoint 429": 6, "model endpoint 500": 3}
    assert retries["reasons"]["model endpoint 500"]["example"].startswith("model endpoint answered 500")
    # the journal holds each attempt: failed ones marked as put back in the queue
    lines = [e["hermes"] for _, p in journal.batch_files(tmp_path / "data" / "shaky") for e in journal.read(p)]
    assert len(lines) == 6 + 9
    assert sorted(m["attempt"] for m in lines if not m["requeued"]) == [2, 2, 2, 3, 3, 3]
    assert all(m["status"] == "failed" for m in lines if m["requeued"])
    assert json.loads((tmp_path / "data" / "shaky" / "statistics.json").read_text())["retries"] == retries


@pytest.mark.usefixtures("prefect_harness")
def test_permanent_failures_are_not_retried_and_are_reported_by_kind(tmp_path):
    from flows.batch import batch_run

    rows = [{"prompt": f"bad {i} " + script({"error": 400})} for i in range(3)] + [{"prompt": "fine"}]
    with MockLLM() as server:
        settings = RunSettings(dataset_file=str(write_dataset(tmp_path / "d.jsonl", rows)), run_name="bad",
                               output_dir=str(tmp_path / "data"), base_url=server.base_url, model="m",
                               batch_size=4, num_workers=4, max_failed_share=1.0, distribution="terminal_only",
                               sandbox={"backend": "local"})
        stats = batch_run(settings=settings)
        asked = [b["messages"][-1]["content"][:3] for b in server.requests()]
    assert asked.count("bad") == 3  # a 400 is neither retried by the client nor put back in the queue
    assert stats["prompts_failed"] == 3 and stats["retries"]["attempts_retried"] == 0
    assert list(stats["failure_reasons"]) == ["model endpoint 400"]
    assert stats["failure_reasons"]["model endpoint 400"]["count"] == 3
    status = run_status(tmp_path / "data" / "bad")
    assert status["failure_reasons"]["model endpoint 400"]["count"] == 3
    assert "3 × model endpoint 400  (e.g. model endpoint answered 400" in format_status(status)


def test_one_cause_is_one_kind_whatever_its_message_says():
    # a provider's 429 text carries a varying wait: one kind, not one reason per text
    errors = [f"model endpoint answered 429: Rate limit reached. Please try again in {s}s." for s in ("0.82", "1.1", "3")]
    errors += ["Docker engine too slow: create waited 30s behind 12 container operations in flight",
               "Docker engine too slow: start waited 30s behind 7 container operations in flight",
               "image not available: nope:1 (pull access denied)", "model endpoint failed: Request timed out.",
               "model endpoint failed: Connection error.", "model endpoint answered 400: bad tool schema",
               "ValueError: row 17 of 300 is odd", "ValueError: row 4 of 300 is odd"]
    grouped = group(errors)
    assert {k: g["count"] for k, g in grouped.items()} == {
        "model endpoint 429": 3, "engine time-out": 2, "ValueError: row N of N is odd": 2, "image unavailable": 1,
        "model endpoint time-out": 1, "model endpoint connection failed": 1, "model endpoint 400": 1}
    assert grouped["model endpoint 429"]["example"] == errors[0]
    assert [classify(e).transient for e in errors] == [True] * 5 + [False] + [True, True] + [False] * 3
