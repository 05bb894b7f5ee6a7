"""The attempt policies' decisions (hermes.run.attempt_policy), read off a real run index: which
attempts may start given the verdicts in the journal, in which order, and under a budget. Then two
runs on the local backend: siblings stopped in flight, and a policy's batches on worker processes.
(tests/run/test_attempt_policy.py runs them in Docker, with task folders, kills and resumes.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes.data.run_index import RUN_MEMORY, RunIndex
from hermes.run import direct, orchestration
from hermes.run.attempt_policy import AttemptPolicy
from hermes.sandbox.base import SandboxSettings
from hermes.settings import RunSettings
from tests.helpers import read_jsonl, script, write_dataset

K = 4


def _index(tmp_path: Path, tasks: int, verdicts: dict[tuple[int, int], str]) -> RunIndex:
    """A run index over `tasks` rows of K attempts, with journal outcomes {(task, attempt): status}
    where status is "pass", "fail", "error" or "stopped"."""
    index = RunIndex(tmp_path, lean=True, memory=RUN_MEMORY)
    con = index.con
    con.execute("CREATE OR REPLACE TEMP TABLE dataset (idx BIGINT, key VARCHAR)")
    con.execute(f"INSERT INTO dataset SELECT i, 't' || i || '-0' FROM range({tasks}) r(i)")
    for a in range(2, K + 1):  # as load_dataset orders them: every first attempt, then every second...
        con.execute("INSERT INTO dataset SELECT idx, key || '#a' || ? FROM dataset WHERE NOT contains(key, '#')", [a])
    for n, ((task, attempt), outcome) in enumerate(sorted(verdicts.items())):
        key = f"t{task}-0" + (f"#a{attempt}" if attempt > 1 else "")
        status = {"pass": "completed", "fail": "completed", "error": "failed", "stopped": "stopped"}[outcome]
        passed = {"pass": True, "fail": False}.get(outcome)
        con.execute("INSERT INTO outcomes VALUES (0, ?, ?, ?, NULL, ?)", [n, key, status, passed])
    AttemptPolicy.begin(con)
    return index


def _next(index: RunIndex, policy: AttemptPolicy, flying: list[str] = (), limit: int = 100) -> list[str]:
    return [k for _, k in policy.next_attempts(index, list(flying), limit)]


def test_first_pass_runs_one_attempt_at_a_time_and_none_after_a_pass(tmp_path):
    # task 0 passed at its 2nd attempt, task 1 failed twice, task 2 never ran, task 3 errored once
    index = _index(tmp_path, 4, {(0, 1): "fail", (0, 2): "pass", (1, 1): "fail", (1, 2): "fail", (3, 1): "error"})
    policy = AttemptPolicy(name="first_pass", k=K)
    # first every task's fewest-attempts-so-far: task 2 (none), task 3 (its errored attempt again), then task 1
    assert _next(index, policy) == ["t2-0", "t3-0", "t1-0#a3"]
    # a task with an attempt in flight gets no second one (P = 1)
    assert _next(index, policy, flying=["t2-0"]) == ["t3-0", "t1-0#a3"]
    # P = 2: two at a time, round by round (a task's n-th attempt from now after every (n-1)-th)
    assert _next(index, AttemptPolicy(name="first_pass", k=K, p=2)) == ["t2-0", "t3-0", "t2-0#a2", "t3-0#a2",
                                                                         "t1-0#a3", "t1-0#a4"]


def test_a_task_that_failed_all_k_is_done_and_an_errored_attempt_is_given_up_at_max_attempts(tmp_path):
    index = _index(tmp_path, 2, {**{(0, a): "fail" for a in range(1, K + 1)}, (1, 1): "error"})
    assert _next(index, AttemptPolicy(name="first_pass", k=K)) == ["t1-0"]
    assert _next(index, AttemptPolicy(name="first_pass", k=K, max_tries=1)) == ["t1-0#a2"]


def test_informative_runs_m_first_stops_all_pass_groups_and_goes_on_until_a_pass(tmp_path):
    index = _index(tmp_path, 4, {(0, 1): "pass", (0, 2): "pass",      # too easy: stops at m
                                 (1, 1): "pass", (1, 2): "fail",      # signal already: stops
                                 (2, 1): "fail", (2, 2): "fail"})     # no pass yet: goes on
    policy = AttemptPolicy(name="informative", k=K, m=2)
    assert _next(index, policy) == ["t3-0", "t3-0#a2", "t2-0#a3"]  # task 3's m = 2 at once


def test_a_stopped_attempt_is_settled_neither_a_pass_nor_a_fail(tmp_path):
    index = _index(tmp_path, 1, {(0, 1): "pass", (0, 2): "stopped"})
    assert _next(index, AttemptPolicy(name="first_pass", k=K)) == []
    assert _next(index, AttemptPolicy(name="all", k=K)) == ["t0-0#a3", "t0-0#a4"]


def test_the_budget_goes_to_unsolved_tasks_with_the_fewest_attempts_first(tmp_path):
    index = _index(tmp_path, 3, {(0, 1): "pass", (1, 1): "fail", (1, 2): "fail"})
    # spent so far: 3 attempts; a budget of 6 leaves 3. Under `all` with a budget a task's attempts go
    # one at a time (P = 1), each chosen after the verdicts before it: task 0, solved, comes last
    policy = AttemptPolicy(name="all", k=K, budget=6)
    assert _next(index, policy) == ["t2-0", "t1-0#a3", "t0-0#a2"]
    # what this invocation handed out counts against the budget too
    AttemptPolicy.handing_out(index.con, ["t2-0", "t2-0#a2"])
    assert _next(index, policy) == ["t1-0#a3"]


def _run(tmp_path: Path, base_url: str, rows: list[dict], **kw) -> tuple[dict, list[dict]]:
    dataset = write_dataset(tmp_path / "rows.jsonl", rows)
    settings = RunSettings(dataset_file=str(dataset), run_name="pol", output_dir=str(tmp_path / "data"),
                           base_url=base_url, model="mock-model", batch_size=2, num_workers=4, attempts=K,
                           sandbox=SandboxSettings(backend="local"), max_no_tool_use_share=1, **kw)
    engine = orchestration if kw.get("worker_processes") else direct
    stats = engine.run(settings)
    lines = [e for p in sorted((tmp_path / "data" / "pol").glob("batch_*.jsonl")) for e in read_jsonl(p)]
    return stats, lines


DONE = {"reasoning": "Report.", "content": "Done."}


def test_siblings_in_flight_when_a_pass_lands_are_stopped_and_recorded_so(tmp_path, mock_llm):
    # Two attempts at once (P = 2): the first to reach its check takes the lock and passes; the other's
    # check waits a minute, and is stopped when the pass lands. Attempts 3 and 4 never start.
    lock = tmp_path / "lock"
    rows = [{"prompt": "Race. " + script(DONE), "check": f"mkdir {lock} 2>/dev/null || (sleep 60; false)"}]
    stats, lines = _run(tmp_path, mock_llm.base_url, rows, attempt_policy="first_pass", attempt_parallelism=2)
    assert sorted((e["hermes"]["status"], e["hermes"].get("stop_reason")) for e in lines) == [
        ("completed", None), ("stopped", "attempt_policy")]
    assert stats["attempt_policy"]["attempts_stopped"] == 1 and stats["attempt_policy"]["tasks_solved"] == 1
    assert stats["trajectories_written"] == 1  # a stopped attempt is never a trajectory


def test_a_policy_on_worker_processes_plans_as_their_batches_land(tmp_path, mock_llm):
    rows = ([{"prompt": f"Pass {i}. " + script(DONE), "check": "true", "case": "pass"} for i in range(3)]
            + [{"prompt": f"Fail {i}. " + script(DONE), "check": "false", "case": "fail"} for i in range(3)])
    stats, lines = _run(tmp_path, mock_llm.base_url, rows, attempt_policy="first_pass", worker_processes=2)
    trials = {c: sorted(e["hermes"].get("trial", 1) for e in lines if e["metadata"]["case"] == c) for c in ("pass", "fail")}
    assert trials == {"pass": [1, 1, 1], "fail": [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]}
    assert stats["attempt_policy"]["attempts_saved"] == 3 * (K - 1)
    assert "pass_at_k" not in stats["task_statistics"] and "first_pass" in stats["task_statistics"]["pass_at_k_absent"]


def _branched(pass_on: list[int], passing: str, failing: str, slow_fail: float = 0) -> str:
    def turns(command: str, sleep: float) -> dict:
        first = {"reasoning": "Act.", "tool_calls": [{"name": "terminal", "arguments": {"command": command}}]}
        return {"turns": [{**first, "sleep": sleep} if sleep else first, DONE]}
    return "MOCK_SCRIPT: " + json.dumps({"pass": turns(passing, 0), "fail": turns(failing, slow_fail), "pass_on": pass_on})


def test_a_pass_whose_batch_has_not_landed_starts_no_more_attempts_of_its_task(tmp_path, mock_llm):
    # Batches of two, round by round: [A1, B1] then [A2, B2]. A1 passes at once; B1 takes 5 s, so its
    # batch lands late. A2 (stopped by A1's pass) and B2 land first: the index does not hold A1's pass
    # yet, and A must still get no third attempt. B never passes and runs all K.
    rows = [{"prompt": "Task A. " + _branched([1], "echo ok > out.txt", "echo no > out.txt"),
             "check": "grep -q ok out.txt || (sleep 60; false)", "case": "A"},
            {"prompt": "Task B. " + _branched([2], "echo b", "echo b", slow_fail=5), "check": "false", "case": "B"}]
    stats, lines = _run(tmp_path, mock_llm.base_url, rows, attempt_policy="first_pass", attempt_parallelism=2)
    got = sorted((e["metadata"]["case"], e["hermes"].get("trial", 1), e["hermes"]["status"]) for e in lines)
    assert got == [("A", 1, "completed"), ("A", 2, "stopped"),
                   ("B", 1, "completed"), ("B", 2, "completed"), ("B", 3, "completed"), ("B", 4, "completed")]
    assert stats["attempt_policy"]["attempts_spent"] == 6
