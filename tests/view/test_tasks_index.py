"""The tasks page's groups and the alignment, on journal lines in the run's shape (real DuckDB, the
viewer's own index): attempts stopped by the attempt policy (issue 46's line shape), retried
attempts, runs with and without task folders; and where the end-of-run summary points."""
from __future__ import annotations

from hermes.run.summary import format_summary
from hermes.view import align, compare, tasks
from hermes.view.index import ViewIndex
from tests.view.journal import call, line, say, write_run

LS, CAT = call("terminal", {"command": "ls"}, "a b"), call("terminal", {"command": "cat a"}, "x")


def kinds(index: ViewIndex) -> dict[str, list[str]]:
    return {k: [t["task"] for t in tasks.tasks(index, tasks.TaskFilters(kind=k))["tasks"]] for k in tasks.KINDS}


def test_tasks_group_attempts_and_the_policy_filter_finds_stopped_and_missing_attempts(tmp_path):
    lines = [
        line(0, "k1", "Fix", [LS, CAT, say("Done.")], 1, True, task="fix-build"),
        # attempt 2 failed once (put back in the queue), then ran: its outcome is the later line
        line(0, "k1", "Fix", [], 2, None, task="fix-build", status="failed", error="model endpoint answered 429"),
        line(0, "k1", "Fix", [LS, say("No.")], 2, False, task="fix-build"),
        line(1, "k2", "Easy", [say("Yes.")], 1, True),
        line(1, "k2", "Easy", [], 2, None, status="stopped", stop_reason="attempt_policy"),
        line(2, "k3", "Hard", [say("No.")], 1, False),
        line(2, "k3", "Hard", [say("No.")], 2, False),
        line(2, "k3", "Hard", [say("No.")], 3, False),
        line(3, "k4", "Short", [say("Yes.")], 1, True),  # first_pass: attempts 2 and 3 never ran, no line
    ]
    index = ViewIndex(write_run(tmp_path / "r", lines, {"attempts": 3, "attempt_policy": "first_pass"}))
    page = tasks.tasks(index, tasks.TaskFilters())
    assert [t["task"] for t in page["tasks"]] == ["fix-build", "k2", "k3", "k4"]  # run order, by key or folder
    fix = page["tasks"][0]
    assert (fix["attempts"], fix["passes"], fix["checked"], fix["pass_rate"]) == (2, 1, 2, 50.0)
    assert [m["passed"] for m in fix["marks"]] == [True, False]
    assert page["attempt_policy"] == "first_pass" and page["attempts_k"] == 3
    found = kinds(index)
    assert found["flaky"] == ["fix-build"] and found["unsolved"] == ["k3"] and found["solved"] == ["k2", "k4"]
    assert found["stopped"] == ["fix-build", "k2", "k4"]  # a stopped line, or fewer than K attempts
    assert tasks.tasks(index, tasks.TaskFilters(sort="pass_rate"))["tasks"][0]["task"] == "k3"
    assert tasks.tasks(index, tasks.TaskFilters(q="HARD"))["total"] == 1
    assert tasks.neighbour(index, "fix-build", "unsolved", 1) == "k3"
    assert tasks.neighbour(index, "k3", "flaky", 1) == "fix-build"  # wraps around
    assert tasks.neighbour(index, "fix-build", None, -1) == "k4"
    # under policy `all`, fewer attempts than K is a run still going, not a stop
    plain = ViewIndex(write_run(tmp_path / "all", lines[3:], {"attempts": 3, "attempt_policy": "all"}))
    assert kinds(plain)["stopped"] == ["k2"]


def test_alignment_puts_matching_steps_side_by_side_and_marks_the_first_divergence():
    a, b, c = list("abcd"), list("abxd"), list("aybcd")
    rows = align.align([a, b, c])
    assert rows == [[0, 0, 0], [None, None, 1], [1, 1, 2], [2, 2, 3], [3, 3, 4]]  # c's extra step: a gap row
    first, per = align.divergence([a, b, c], rows)
    assert first == 1 and per == [None, 3, 1]
    same = align.align([a, a])
    assert align.divergence([a, a], same) == (None, [None, None])
    # attempts too long for the quadratic table: difflib's matcher, the same rows
    long_a = [f"call {i}" for i in range(600)]
    long_b = long_a[:300] + ["other"] + long_a[300:]
    rows = align.align([long_a, long_b])
    assert len(rows) == 601 and rows[300] == [None, 300] and align.divergence([long_a, long_b], rows)[0] == 300


def test_a_step_is_a_turn_and_its_signature_ignores_outputs_and_key_order():
    _, one = align.steps([{"from": "human", "value": "go"}, *line(0, "k", "go", [call("t", {"a": 1, "b": 2}, "out 1")])
                          ["conversations"][2:]])
    _, two = align.steps(line(0, "k", "go", [call("t", {"b": 2, "a": 1}, "out 2"), say("  Done. ")])["conversations"])
    assert one[0]["sig"] == two[0]["sig"] and two[1]["sig"] == "text:done."
    assert two[0]["results"][0]["content"] == "out 2"


def test_compare_of_two_runs_reads_only_the_tasks_lines(tmp_path):
    a = ViewIndex(write_run(tmp_path / "a", [line(0, "k1", "Fix", [LS, CAT, say("Done.")], t, t != 2) for t in (1, 2, 3)]))
    b = ViewIndex(write_run(tmp_path / "b", [line(0, "k1", "Fix", [LS, say("No.")], 1, False)]))
    data = compare.compare([(n, i, r) for n, i in (("a", a), ("b", b)) for r in compare.task_lines(i, "k1")])
    assert [c["run"] for c in data["columns"]] == ["a", "a", "a", "b"]
    assert data["first_divergence"] == 1 and data["diverges_at"] == [None, None, None, 1]
    assert [c["trial"] for c in data["columns"]] == [1, 2, 3, 1]
    joined = tasks.runs(a, b, tasks.RunsFilters())
    assert joined["lost_in_b"] == 1 and joined["tasks"][0]["change"] == "lost"
    assert compare.entry_lines(a, [(0, 2)])[0][3] == 2 and len(compare.entry_lines(a, [(0, None)])) == 3


def test_the_summary_points_at_the_tasks_page_when_rows_were_judged():
    stats = {"run_name": "r", "total_prompts": 2, "task_statistics": {"pass_at_k": {"1": 0.5}}}
    assert "/tasks" in format_summary(stats)
    assert "/tasks" not in format_summary({"run_name": "r", "total_prompts": 2})
