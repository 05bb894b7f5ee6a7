"""The tasks page and attempts side by side, in real Chromium (issue 47).

Real runs: the direct engine, the local sandbox backend, checks that look at what the agent wrote,
and a model server of this test's on loopback (the real wire format) that answers the n-th
conversation of a prompt with the n-th of its plans: the attempts of one task share their prompt,
so the bundled mock's per-prompt script would make them all alike. The real `hermes-batch view`
serves them; Chromium drives the pages; screenshots go to the test's tmp folder.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hermes.run import direct
from hermes.sandbox.base import SandboxSettings
from hermes.settings import RunSettings
from tests.helpers import write_dataset
from tests.wire_server import WireServer, completion, error
from tests.view.test_viewer import ROOT, browser, page, shown  # noqa: F401 (fixtures)

CHECK = 'grep -q ok out.txt && echo "PASS: out.txt says ok" || { echo "FAIL: out.txt says $(cat out.txt)"; exit 1; }'


def sh(command: str) -> dict:
    return {"call": {"command": command}}


START, WHERE = sh("echo start"), sh("pwd")  # pwd: the same call, a different output in each sandbox
GOOD, BAD = sh("echo ok > out.txt"), sh("echo no > out.txt")
# the run "before": fix passes, fails (differs at the third turn), passes (differs at the fourth: its words)
BEFORE = {"fix": [[START, WHERE, GOOD, {"say": "Done."}], [START, WHERE, BAD, {"say": "Done."}],
                  [START, WHERE, GOOD, {"say": "All done."}]],
          "always": [[sh("seq 1 400"), GOOD, {"say": "Done."}]], "never": [[{"say": "I cannot."}]]}
# the run "after": fix lost, never solved
AFTER = {"fix": [[START, BAD, {"say": "Done."}]], "always": [[GOOD, {"say": "Done."}]], "never": [[GOOD, {"say": "Done."}]]}
ROWS = [{"prompt": f"PLAN:{name} Make out.txt say ok.", "check": CHECK, "case": name} for name in ("fix", "always", "never")]


class PlannedModel:
    """An OpenAI-compatible server (tests/wire_server.py): the n-th conversation of a prompt follows
    plan n (the last plan once they run out); each assistant turn is the plan's next step (a terminal
    call or words). A run asks without streaming: plain chat completions are the wire format here."""

    def __init__(self, plans: dict[str, list[list[dict]]]):
        self.plans, self.seen, self.lock = plans, {}, threading.Lock()
        self.wire = WireServer(self.answer).__enter__()
        self.base_url = self.wire.base_url

    def answer(self, method: str, path: str, body: dict) -> tuple[int, dict]:
        if method != "POST":  # no model list: the run's endpoint check goes on to a completion
            return error(404, f"no {path} here")
        msgs = body["messages"]
        user = next(m["content"] for m in msgs if m["role"] == "user")
        user = user if isinstance(user, str) else json.dumps(user)
        name = user.split("PLAN:", 1)[1].split()[0] if "PLAN:" in user else ""
        turn = sum(m["role"] == "assistant" for m in msgs)
        with self.lock:
            if turn == 0:
                self.seen[user] = self.seen.get(user, 0) + 1
            n = self.seen.get(user, 1)
        plans = self.plans.get(name) or [[{"say": "Done."}]]
        plan = plans[min(n, len(plans)) - 1]
        step = plan[turn] if turn < len(plan) else {"say": "Done."}
        if "call" not in step:
            return 200, completion(step["say"], reasoning="Say.")
        reply = completion(None, reasoning="Act.")
        reply["choices"][0]["message"]["tool_calls"] = [{"id": f"call_{n}_{turn}", "type": "function", "function": {
            "name": "terminal", "arguments": json.dumps(step["call"])}}]
        reply["choices"][0]["finish_reason"] = "tool_calls"
        return 200, reply

    def close(self):
        self.wire.__exit__(None, None, None)


def make_run(tmp: Path, name: str, plans: dict, attempts: int, resume: bool = False) -> dict:
    model = PlannedModel(plans)
    try:
        return direct.run(RunSettings(
            dataset_file=str(write_dataset(tmp / "rows.jsonl", ROWS)), run_name=name, output_dir=str(tmp / "data"),
            base_url=model.base_url, model=f"model-{name}", batch_size=3, num_workers=1, distribution="default",
            attempts=attempts, resume=resume, sandbox=SandboxSettings(backend="local"), max_no_tool_use_share=1))
    finally:
        model.close()


def serve(tmp: Path, *runs: str):
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "view", *runs, "--output_dir", str(tmp / "data"),
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "http://127.0.0.1:" not in line:
        proc.kill()
        raise AssertionError(proc.stderr.read() or line)
    return proc, line


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tasks")
    make_run(tmp, "before", BEFORE, attempts=3)
    make_run(tmp, "after", AFTER, attempts=2)
    proc, line = serve(tmp, "before", "after")
    try:
        yield line.split(" at ")[1].split()[0].rstrip("/"), tmp, line
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def snap(pg, tmp: Path, name: str) -> None:
    pg.screenshot(path=str(tmp / f"{name}.png"), full_page=True)


def task_rows(pg) -> dict[str, str]:
    shown(pg)
    return {r.get_attribute("data-task"): r.inner_text() for r in pg.query_selector_all("[data-testid=task-row]")}


def key_of(pg, case: str) -> str:
    return next(t for t, text in task_rows(pg).items() if f"PLAN:{case} " in text)


def test_the_tasks_page_shows_a_flaky_task_and_filters_it(runs, page):
    url, tmp, _ = runs
    page.goto(url + "/tasks?run=before")
    rows = task_rows(page)
    assert len(rows) == 3
    fix = next(text for text in rows.values() if "PLAN:fix" in text)
    assert "2 / 3" in fix and "66.7%" in fix
    marks = page.locator("[data-testid=task-row]", has_text="PLAN:fix").locator("[data-mark]")
    assert sorted(m.get_attribute("data-mark") for m in marks.all()) == ["fail", "pass", "pass"]
    snap(page, tmp, "tasks_page")
    page.select_option("[data-testid=task-filters] [name=kind]", "flaky")
    page.click("[data-testid=task-filters] button[type=submit]")
    page.wait_for_url(lambda u: "kind=flaky" in u)
    assert [t for t in task_rows(page).values()] and all("PLAN:fix" in t for t in task_rows(page).values())
    page.goto(url + "/tasks?run=before&kind=unsolved")
    assert all("PLAN:never" in t for t in task_rows(page).values()) and len(task_rows(page)) == 1
    page.goto(url + "/tasks?run=before&kind=solved")
    assert all("PLAN:always" in t for t in task_rows(page).values()) and len(task_rows(page)) == 1
    page.goto(url + "/tasks?run=before&sort=pass_rate")
    assert ["PLAN:never" in t for t in task_rows(page).values()] == [True, False, False]


def test_three_attempts_side_by_side_marked_where_they_diverge(runs, page):
    url, tmp, _ = runs
    page.goto(url + "/tasks?run=before")
    key = key_of(page, "fix")
    page.click(f"[data-task='{key}'] [data-testid=task-link]")
    page.wait_for_url(lambda u: "/compare?" in u)
    shown(page)
    heads = page.locator("[data-testid=column-head]")
    assert heads.count() == 3
    verdicts = [h.inner_text() for h in heads.all()]
    assert sum("passed" in v for v in verdicts) == 2 and sum("failed" in v for v in verdicts) == 1
    # the first divergence flag sits on the third row: the two attempts that wrote ok against the one that wrote no
    flag = page.locator("[data-testid=first-divergence]")
    assert flag.count() == 1
    assert page.locator("[data-testid=row-gutter]").nth(2).locator("[data-testid=first-divergence]").count() == 1
    third = page.locator("[data-testid=step][data-row='2']")
    assert {c.inner_text().count("echo ok > out.txt") for c in third.all()} == {0, 1}
    assert all(c.get_attribute("data-turn") == "3" for c in third.all())
    failed_col = next(i for i, v in enumerate(verdicts) if "failed" in v)
    mark = page.locator(f"[data-testid=step][data-column='{failed_col}'] [data-testid=diverges-here]")
    assert mark.count() == 1 and mark.locator("xpath=..").get_attribute("data-row") == "2"
    # rows 1 and 2: the same calls side by side; pwd printed each sandbox's own folder: diff on demand
    assert page.locator("[data-testid=row-gutter]").nth(0).get_attribute("class").endswith("same")
    diff_button = page.locator("[data-testid=step][data-row='1'] [data-testid=diff-button]").first
    diff_button.click()
    diff = page.locator("[data-testid=result-diff]").first.inner_text()
    assert diff.count("\n- ") + diff.startswith("- ") >= 1 and "+ " in diff
    assert "exit" in verdicts[0]  # each column headed by its verdict, reward, the check's exit and output
    assert "FAIL: out.txt says no" in heads.nth(failed_col).locator("[data-testid=reward-tail]").inner_text()
    snap(page, tmp, "compare_three")
    # compare?entries=: any two entries; the two that share two turns diverge on the third
    ids = [h.get_attribute("data-entry") for h in heads.all()]  # prompt_index:attempt
    page.goto(url + f"/compare?run=before&entries={ids[failed_col]},{ids[(failed_col + 1) % 3]}")
    shown(page)
    assert page.locator("[data-testid=column-head]").count() == 2
    assert page.locator("[data-testid=row-gutter]").nth(2).locator("[data-testid=first-divergence]").count() == 1


def test_keyboard_moves_between_tasks(runs, page):
    url, tmp, _ = runs
    page.goto(url + "/tasks?run=before")
    keys = {case: key_of(page, case) for case in ("fix", "always", "never")}
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("Enter")  # the second task of the run
    page.wait_for_url(lambda u: "/compare?" in u)
    shown(page)
    assert page.inner_text("[data-testid=compare-title]").startswith(f"Task {keys['always']}")
    long_output = page.locator("[data-testid=step][data-row='0'] details[data-testid=result-text]").first
    assert long_output.get_attribute("open") is None and "400" not in long_output.locator("summary").inner_text()
    long_output.locator("summary").click()  # a long tool output is folded until asked for
    assert "\n400" in long_output.locator("pre").inner_text()

    def press(key: str) -> str:
        before = page.url
        page.keyboard.press(key)
        page.wait_for_url(lambda u: u != before)
        shown(page)
        return page.inner_text("[data-testid=compare-title]")

    assert press("u").startswith(f"Task {keys['never']}")   # next never solved
    assert press("f").startswith(f"Task {keys['fix']}")     # next flaky (wraps around)
    assert press("j").startswith(f"Task {keys['always']}")  # next
    assert press("k").startswith(f"Task {keys['fix']}")     # previous
    page.keyboard.press("t")
    page.wait_for_url(lambda u: "/tasks" in u)
    assert len(task_rows(page)) == 3


def test_two_runs_side_by_side(runs, page):
    url, tmp, line = runs
    assert "compare?runs=before,after" in line  # the command says where
    page.goto(url + "/tasks?runs=before,after")  # the tasks page of both
    shown(page)
    assert page.inner_text("[data-testid=solved-in-b]").startswith("1")
    page.goto(url + "/compare?runs=before,after")
    shown(page)
    assert page.inner_text("[data-testid=a-pass-rate]").startswith("55.6%")  # 5 of 9
    assert page.inner_text("[data-testid=b-pass-rate]").startswith("66.7%")  # 4 of 6
    assert page.inner_text("[data-testid=solved-in-b]").startswith("1") and page.inner_text("[data-testid=lost-in-b]").startswith("1")
    changes = {r.inner_text().split("\t")[-1]: r.inner_text() for r in page.query_selector_all("[data-testid=runs-row]")}
    rows = page.query_selector_all("[data-testid=runs-row]")
    by_case = {next(c for c in ("fix", "always", "never") if f"PLAN:{c} " in r.inner_text()): r for r in rows}
    assert "solved in B" in by_case["never"].inner_text() and "lost in B" in by_case["fix"].inner_text()
    assert "unchanged" in by_case["always"].inner_text() and changes
    snap(page, tmp, "two_runs")
    by_case["fix"].query_selector("[data-testid=task-link]").click()
    page.wait_for_url(lambda u: "task=" in u)
    shown(page)
    heads = [h.inner_text() for h in page.locator("[data-testid=column-head]").all()]
    assert [h.split(" · ")[0] for h in heads] == ["before"] * 3 + ["after"] * 2
    snap(page, tmp, "two_runs_task")


def test_entries_link_to_their_task_and_a_run_in_progress_shows_new_attempts(runs, page):
    url, tmp, _ = runs
    page.goto(url + "/?run=before")
    shown(page)
    page.locator("[data-testid=entry-row]").first.locator("[data-testid=compare-link]").click()
    page.wait_for_url(lambda u: "/compare?" in u)
    shown(page)
    assert page.locator("[data-testid=column-head]").count() == 3
    page.goto(url + "/tasks?run=before")
    before = task_rows(page)
    assert all(t.split("\t")[1] == "3" for t in before.values())
    with ThreadPoolExecutor(1) as pool:  # a fourth attempt of each task, while the viewer serves the run
        pool.submit(make_run, tmp, "before", BEFORE, 4, True).result()
    page.reload()
    after = task_rows(page)
    assert after.keys() == before.keys() and all(t.split("\t")[1] == "4" for t in after.values())
