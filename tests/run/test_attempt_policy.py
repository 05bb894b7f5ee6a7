"""--attempt_policy first_pass | informative and --attempt_budget: attempts spent where they teach.

Real containers, the real DuckDB index, the bundled model on loopback. Its branched scripts
(mockllm.branches) give each task a known way to pass: ``pass_on`` (the nth conversation of the
task passes: deterministic with one attempt of a task at a time) or ``pass_chance`` drawn from
the attempt's seed (--sampling_seed: the same verdicts on every rerun, killed or not). Whole runs
without Prefect (hermes.run.direct, as `--engine direct`) except where the CLI process is killed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hermes.run import direct
from hermes.sandbox.base import SandboxSettings
from hermes.settings import RunSettings
from tests.conftest import containers_of
from tests.helpers import read_jsonl, unique_run, write_dataset

SOLVE = {"reasoning": "Solve.", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo ok > solved.txt"}}]}
MISS = {"reasoning": "Guess.", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo no > guess.txt"}}]}
DONE = {"reasoning": "Report.", "content": "Done."}
CHECK = "grep -qx ok solved.txt"


def branched(title: str, *, slow_fail: float = 0, slow: float = 0, **how) -> str:
    """A prompt whose conversations pass (write solved.txt) or fail (do not) as ``how`` says."""
    last = {**DONE, "sleep": slow} if slow else DONE
    fail = [{**MISS, "sleep": slow_fail} if slow_fail else MISS, last]
    return f"{title} MOCK_SCRIPT: " + json.dumps({"pass": {"turns": [SOLVE, last]}, "fail": {"turns": fail}, **how})


def rows(**tasks: dict) -> list[dict]:
    """One JSONL row per task: name -> branched() options."""
    return [{"prompt": branched(f"Task {name}: write ok to solved.txt.", **how), "case": name, "check": CHECK}
            for name, how in tasks.items()]


def run(tmp_path: Path, data: list[dict], name: str, base_url: str, **kw) -> dict:
    dataset = write_dataset(tmp_path / f"{name}.jsonl", data)
    kw = {"batch_size": 2, "num_workers": 2, **kw}
    return direct.run(RunSettings(dataset_file=str(dataset), run_name=name, output_dir=str(tmp_path / "data"),
                                  base_url=base_url, model="mock-model", sandbox=SandboxSettings(),
                                  distribution="terminal_only", **kw))


def lines_of(tmp_path: Path, name: str) -> list[dict]:
    return [e for p in sorted((tmp_path / "data" / name).glob("batch_*.jsonl")) for e in read_jsonl(p)]


def groups(lines: list[dict], by: str = "case") -> dict[str, list[tuple[int, str, bool | None]]]:
    """Per task: (attempt, status, check passed) of each journal line, by attempt."""
    out: dict[str, list] = {}
    for e in lines:
        out.setdefault(e["metadata"][by], []).append(
            (e["hermes"].get("trial", 1), e["hermes"]["status"], (e.get("reward") or {}).get("passed")))
    return {t: sorted(v) for t, v in out.items()}


def exactly_once(lines: list[dict]) -> None:
    keys = [e["hermes"]["key"] for e in lines]
    assert len(keys) == len(set(keys)), "an attempt has two journal lines"
    for e in lines:  # attempt n of a row is <key>#a<n>
        trial = e["hermes"].get("trial", 1)
        assert (trial == 1 and "#a" not in e["hermes"]["key"]) or e["hermes"]["key"].endswith(f"#a{trial}")


def test_first_pass_stops_each_task_at_its_first_passed_check(tmp_path, mock_llm, sandbox_image, docker_engine):
    name = unique_run("first")
    data = rows(second={"pass_on": [2]}, first={"pass_on": [1]}, never={"pass_chance": 0})
    stats = run(tmp_path, data, name, mock_llm.base_url, attempts=4, attempt_policy="first_pass")
    got = groups(lines_of(tmp_path, name))
    assert got == {"second": [(1, "completed", False), (2, "completed", True)],  # attempts 3, 4 never started
                   "first": [(1, "completed", True)],
                   "never": [(n, "completed", False) for n in (1, 2, 3, 4)]}
    exactly_once(lines_of(tmp_path, name))

    policy = stats["attempt_policy"]
    assert {k: policy[k] for k in ("policy", "k", "tasks", "tasks_solved", "attempts_run", "attempts_stopped",
                                   "attempts_saved")} == {
        "policy": "first_pass", "k": 4, "tasks": 3, "tasks_solved": 2, "attempts_run": 7, "attempts_stopped": 0,
        "attempts_saved": 12 - 7}
    assert policy["attempts_per_solved_task"] == 3.5 and abs(policy["solve_rate"] - 2 / 3) < 0.01
    ts = stats["task_statistics"]
    assert "pass_at_k" not in ts and isinstance(ts["pass_at_k_absent"], str) and ts["pass_at_k_absent"]
    on_disk = json.loads((tmp_path / "data" / name / "statistics.json").read_text())
    assert on_disk["attempt_policy"]["attempts_run"] == 7 and "pass_at_k" not in on_disk["task_statistics"]

    asked = len(mock_llm.requests())  # a resume of a finished first_pass run owes nothing
    run(tmp_path, data, name, mock_llm.base_url, attempts=4, attempt_policy="first_pass", resume=True)
    assert len(mock_llm.requests()) == asked and len(lines_of(tmp_path, name)) == 7
    assert containers_of(docker_engine, name) == []


def test_all_keeps_running_every_attempt_and_pass_at_k(tmp_path, mock_llm, sandbox_image):
    name = unique_run("all")
    # one prompt at a time: under `all` a task's attempts may otherwise reach the model in any order
    stats = run(tmp_path, rows(first={"pass_on": [1]}, never={"pass_chance": 0}), name, mock_llm.base_url, attempts=2,
                num_workers=1)
    assert groups(lines_of(tmp_path, name)) == {"first": [(1, "completed", True), (2, "completed", False)],
                                                "never": [(1, "completed", False), (2, "completed", False)]}
    assert stats["task_statistics"]["pass_at_k"] == {"1": 0.25, "2": 0.5}  # n=2: c=1 -> 1/2, 1; c=0 -> 0, 0
    assert "pass_at_k_absent" not in stats["task_statistics"]
    policy = stats["attempt_policy"]
    assert (policy["policy"], policy["attempts_run"], policy["attempts_saved"], policy["tasks_solved"]) == ("all", 4, 0, 1)


def test_a_sibling_in_flight_when_a_pass_lands_is_stopped_and_recorded_so(tmp_path, mock_llm, sandbox_image,
                                                                          docker_engine):
    # P = 2: attempts 1 and 2 start together; the first conversation the model sees passes at once, the
    # other fails slowly (its first answer takes 60 s): it is in flight when the pass lands
    name = unique_run("sibling")
    data = rows(race={"pass_on": [1], "slow_fail": 60})
    stats = run(tmp_path, data, name, mock_llm.base_url, attempts=4, attempt_policy="first_pass",
                attempt_parallelism=2)
    lines = lines_of(tmp_path, name)
    exactly_once(lines)
    got = groups(lines)["race"]
    assert sorted(t for t, _, _ in got) == [1, 2]  # attempts 3 and 4 never started
    passed = [e for e in lines if e["hermes"]["status"] == "completed"]
    stopped = [e for e in lines if e["hermes"]["status"] == "stopped"]
    assert len(passed) == 1 and passed[0]["reward"]["passed"] is True
    assert len(stopped) == 1 and stopped[0]["hermes"]["stop_reason"] == "attempt_policy"
    assert not (stopped[0].get("reward") or {}).get("passed")
    policy = stats["attempt_policy"]
    assert (policy["attempts_stopped"], policy["attempts_run"] + policy["attempts_stopped"], policy["attempts_saved"],
            policy["tasks_solved"]) == (1, 2, 2, 1)
    assert stats.get("prompts_failed", 0) == 0  # stopped by the policy: not a failure
    assert containers_of(docker_engine, name) == []  # the stopped attempt's sandbox is gone too

    asked = len(mock_llm.requests())  # stopped is not owed: a resume runs nothing
    run(tmp_path, data, name, mock_llm.base_url, attempts=4, attempt_policy="first_pass", attempt_parallelism=2,
        resume=True)
    assert len(mock_llm.requests()) == asked and len(lines_of(tmp_path, name)) == 2


def test_informative_stops_all_pass_groups_at_m_and_grows_the_others_until_they_hold_a_pass_and_a_fail(
        tmp_path, mock_llm, sandbox_image):
    name = unique_run("informative")
    data = rows(easy={"pass_chance": 1}, split={"pass_on": [1]}, late={"pass_on": [3]}, hard={"pass_chance": 0})
    stats = run(tmp_path, data, name, mock_llm.base_url, attempts=4, attempt_policy="informative", min_attempts=2)
    lines = lines_of(tmp_path, name)
    exactly_once(lines)
    verdicts = {t: sorted(bool(p) for _, _, p in v) for t, v in groups(lines).items()}
    assert verdicts == {"easy": [True, True],                  # all passed at m = 2: no signal, stop
                        "split": [False, True],                # a pass and a fail at m: signal, stop
                        "late": [False, False, True],          # grows until its first pass
                        "hard": [False, False, False, False]}  # never a pass: up to K
    policy = stats["attempt_policy"]
    assert (policy["policy"], policy["attempts_run"], policy["groups_with_signal"], policy["attempts_saved"]) == (
        "informative", 11, 2, 16 - 11)
    assert "pass_at_k" not in stats["task_statistics"] and stats["task_statistics"]["pass_at_k_absent"]


def test_the_budget_goes_to_unsolved_tasks_first(tmp_path, mock_llm, sandbox_image):
    # K = 4 and 6 attempts in all: one each first; the easy task is solved by its first, the two hard
    # ones (fewest attempts, no pass) get the rest in turn. Which hard one gets the sixth depends on
    # which verdict lands first (two workers): the dataset order breaks ties only among open attempts
    name = unique_run("budget")
    data = rows(hard1={"pass_chance": 0}, easy={"pass_chance": 1}, hard2={"pass_chance": 0})
    stats = run(tmp_path, data, name, mock_llm.base_url, attempts=4, attempt_policy="first_pass", attempt_budget=6)
    lines = lines_of(tmp_path, name)
    exactly_once(lines)
    spent = {t: len(v) for t, v in groups(lines).items()}
    assert spent["easy"] == 1 and sorted([spent["hard1"], spent["hard2"]]) == [2, 3]
    policy = stats["attempt_policy"]
    assert (policy["budget"], policy["attempts_run"], policy["tasks_solved"]) == (6, 6, 1)

    asked = len(mock_llm.requests())  # the budget is spent: a resume runs nothing more
    run(tmp_path, data, name, mock_llm.base_url, attempts=4, attempt_policy="first_pass", attempt_budget=6, resume=True)
    assert len(mock_llm.requests()) == asked and len(lines_of(tmp_path, name)) == 6


def test_a_task_folder_solved_at_attempt_2_of_4_runs_exactly_2(tmp_path, mock_llm, default_image, docker_engine):
    from tests.data.test_harbor_tasks import TXT_TEST, entries, settings, task

    root = tmp_path / "tasks"
    solve = {"reasoning": "Solve.", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo ok > /app/out.txt"}}]}
    how = {"pass": {"turns": [solve, DONE]}, "fail": {"turns": [MISS, DONE]}, "pass_on": [2]}
    task(root, "second", "Write ok to /app/out.txt. MOCK_SCRIPT: " + json.dumps(how), TXT_TEST)
    task(root, "never", "Put ok in /app/out.txt. MOCK_SCRIPT: " + json.dumps({**how, "pass_on": [9]}), TXT_TEST)
    name = unique_run("folders")
    stats = direct.run(settings(tmp_path, root, name, mock_llm.base_url, attempts=4, attempt_policy="first_pass"))
    got = entries(tmp_path, name)
    exactly_once(got)
    assert groups(got, by="task") == {"second": [(1, "completed", False), (2, "completed", True)],
                                      "never": [(n, "completed", False) for n in (1, 2, 3, 4)]}
    assert {k: stats["task_statistics"]["tasks"]["second"][k] for k in ("attempts", "passed")} == {"attempts": 2, "passed": 1}
    assert stats["attempt_policy"]["attempts_run"] == 6 and stats["attempt_policy"]["tasks_solved"] == 1
    assert containers_of(docker_engine, name) == []


def first_pass_of(row: dict, dataset: Path, k: int = 4, sampling_seed: int = 1) -> list[tuple[int, str, bool]]:
    """The attempts first_pass runs of a pass_chance row, from the seeds hermes sends (turn 0 of each)."""
    from hermes.data.dataset import read_dataset
    from hermes.model.sampling import call_seed
    from mockllm.branches import draw
    from mockllm.conversation import conversation_token

    ds = read_dataset(dataset, attempts=k)
    index = [r["prompt"] for r in read_jsonl(dataset)].index(row["prompt"])
    chance = json.loads(row["prompt"].split("MOCK_SCRIPT: ", 1)[1])["pass_chance"]
    out = []
    for n, key in enumerate(ds.keys()[index * k:(index + 1) * k], start=1):
        passed = draw(conversation_token(row["prompt"]), f"seed {call_seed(sampling_seed, key, 0)}") < chance
        out.append((n, "completed", passed))
        if passed:
            break
    return out


def _cli(dataset: Path, out: Path, name: str, base_url: str) -> list[str]:
    return [shutil.which("hermes-batch") or "hermes-batch", "run", f"--dataset_file={dataset}", f"--run_name={name}",
            f"--output_dir={out}", f"--base_url={base_url}", "--model=mock-model", "--batch_size=1", "--num_workers=2",
            "--attempts=4", "--attempt_policy=first_pass", "--sampling_seed=1", "--engine=direct",
            "--distribution=terminal_only"]  # the image: $HERMES_SANDBOX_IMAGE (tests/conftest.py)


def test_sigkill_after_a_verdict_then_resume_runs_the_same_attempts_as_an_uninterrupted_run(
        tmp_path, mock_llm, sandbox_image, docker_engine):
    # verdicts drawn from each attempt's seed (--sampling_seed 1): the same attempt passes or fails
    # alike in both runs whatever the kill interrupted; each answer is slow enough for the kill to land
    data = rows(**{t: {"pass_chance": 0.4, "slow": 1.0} for t in ("a", "b", "c")})
    dataset = write_dataset(tmp_path / "rows.jsonl", data)
    env = {**os.environ, "HERMES_SANDBOX_IMAGE": sandbox_image}
    clean, killed = unique_run("clean"), unique_run("killed")
    done = subprocess.run(_cli(dataset, tmp_path / "data", clean, mock_llm.base_url), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    expected = groups(lines_of(tmp_path, clean))
    # the verdicts the seeds draw (mockllm.branches): a and c pass at their second attempt, b at its first
    assert expected == {t: first_pass_of(row, dataset) for t, row in zip("abc", data)} == {
        "a": [(1, "completed", False), (2, "completed", True)], "b": [(1, "completed", True)],
        "c": [(1, "completed", False), (2, "completed", True)]}

    cmd = _cli(dataset, tmp_path / "data", killed, mock_llm.base_url)
    verdicts = lambda: [e for e in lines_of(tmp_path, killed) if e.get("reward")]  # noqa: E731
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not verdicts() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.poll() is None and verdicts(), (tmp_path / "first.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert first.returncode == -signal.SIGKILL
    assert len(lines_of(tmp_path, killed)) < sum(len(v) for v in expected.values())  # the kill cut the run short
    resumed = subprocess.run(cmd + ["--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]

    lines = lines_of(tmp_path, killed)  # every attempt one line, each of them a verdict
    exactly_once(lines)
    assert groups(lines) == expected
    assert {e["hermes"]["key"] for e in lines} == {e["hermes"]["key"] for e in lines_of(tmp_path, clean)}
    assert containers_of(docker_engine, killed) == []


@pytest.mark.usefixtures("prefect_harness")
def test_on_the_prefect_flow_a_pass_stops_its_sibling_and_settles_the_task(tmp_path, mock_llm, sandbox_image,
                                                                             docker_engine):
    # the default engine: batches are Prefect task runs of the flow, planned in waves as verdicts land
    from flows.batch import batch_run

    name = unique_run("flow")
    data = rows(race={"pass_on": [1], "slow_fail": 60}, sure={"pass_chance": 1})
    dataset = write_dataset(tmp_path / "flow.jsonl", data)
    stats = batch_run(settings=RunSettings(
        dataset_file=str(dataset), run_name=name, output_dir=str(tmp_path / "data"), base_url=mock_llm.base_url,
        model="mock-model", batch_size=2, num_workers=3, sandbox=SandboxSettings(), distribution="terminal_only",
        attempts=4, attempt_policy="first_pass", attempt_parallelism=2))
    lines = lines_of(tmp_path, name)
    exactly_once(lines)
    race = [e for e in lines if e["metadata"]["case"] == "race"]
    assert sorted(e["hermes"]["status"] for e in race) == ["completed", "stopped"]
    assert [e["reward"]["passed"] for e in race if e["hermes"]["status"] == "completed"] == [True]
    sure = groups(lines)["sure"]  # both attempts start at once (P = 2) and both pass, or the second is stopped
    assert [t for t, _, _ in sure] in ([1], [1, 2]) and any(p for _, status, p in sure if status == "completed")
    assert stats["attempt_policy"]["tasks_solved"] == 2 and stats["attempt_policy"]["attempts_stopped"] >= 1
    assert containers_of(docker_engine, name) == []
