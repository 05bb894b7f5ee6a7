"""--attempts K: each row K prompts of its own, each exactly once; pass@k in statistics.json; a resume
with a larger K runs only the missing attempts. Real containers, the bundled model on loopback."""
from __future__ import annotations

import json
import math

from hermes.data.stats import pass_at_k
from hermes.run import direct
from hermes.sandbox.base import DEFAULT_IMAGE, SandboxSettings
from hermes.settings import RunSettings
from tests.helpers import read_jsonl, script, write_dataset


def test_the_estimator_matches_hand_computed_values():
    # n = 3 attempts, c = 1 passing: pass@1 = 1/3, pass@2 = 1 - C(2,2)/C(3,2) = 2/3, pass@3 = 1
    assert math.isclose(pass_at_k(3, 1, 1), 1 / 3) and math.isclose(pass_at_k(3, 1, 2), 2 / 3)
    assert pass_at_k(3, 1, 3) == 1.0 and pass_at_k(3, 0, 3) == 0.0 and pass_at_k(4, 2, 1) == 0.5


def test_three_attempts_per_row_pass_at_k_and_a_resume_completes_only_the_missing(tmp_path, mock_llm, sandbox_image):
    done = {"reasoning": "Report.", "content": "Done."}
    rows = [{"prompt": "Pass. " + script(done), "check": "true", "case": "pass"},
            {"prompt": "Fail. " + script(done), "check": "false", "case": "fail"}]
    dataset = write_dataset(tmp_path / "rows.jsonl", rows)

    def run(attempts: int, resume: bool = False) -> dict:
        return direct.run(RunSettings(dataset_file=str(dataset), run_name="att", output_dir=str(tmp_path / "data"),
                                      base_url=mock_llm.base_url, model="mock-model", batch_size=2, num_workers=2,
                                      attempts=attempts, resume=resume, sandbox=SandboxSettings(),
                                      max_no_tool_use_share=1))  # prose answers: questions that merely offer tools

    run(2)
    stats = run(3, resume=True)  # the third attempt of each row, nothing more
    lines = [e for p in sorted((tmp_path / "data" / "att").glob("batch_*.jsonl")) for e in read_jsonl(p)]
    per_case = {}
    for e in lines:
        per_case.setdefault(e["metadata"]["case"], []).append(e["hermes"].get("trial", 1))
    assert {c: sorted(t) for c, t in per_case.items()} == {"pass": [1, 2, 3], "fail": [1, 2, 3]}
    assert len({e["hermes"]["key"] for e in lines}) == 6
    # one task always passes, one never: pass@k = (1 + 0) / 2 for every k
    assert stats["task_statistics"]["pass_at_k"] == {"1": 0.5, "2": 0.5, "3": 0.5}
    assert stats["total_prompts"] == 6


def test_a_model_that_solves_every_other_attempt_gives_the_hand_computed_pass_at_k(tmp_path, mock_llm, default_image):
    # attempts of a task share their instruction: the bundled model's branched script (mockllm.branches)
    # solves the 1st and 3rd conversation of each instruction and fails the 2nd
    from tests.data.test_harbor_tasks import DONE, TXT_TEST, entries, settings, shell, task

    how = {"pass": {"turns": [*shell("echo ok > /app/out.txt"), DONE]}, "fail": {"turns": [DONE]}, "pass_on": [1, 3]}
    root = tmp_path / "tasks"
    task(root, "one", "Write ok to /app/out.txt. MOCK_SCRIPT: " + json.dumps(how), TXT_TEST)
    task(root, "two", "Put the word ok in /app/out.txt. MOCK_SCRIPT: " + json.dumps(how), TXT_TEST)
    stats = direct.run(settings(tmp_path, root, "alt", mock_llm.base_url, attempts=3))
    got = entries(tmp_path, "alt")
    per_task = {}
    for e in got:
        per_task.setdefault(e["metadata"]["task"], []).append(e["reward"]["passed"])
    assert {t: len(v) for t, v in per_task.items()} == {"one": 3, "two": 3}
    assert {t: sum(v) for t, v in per_task.items()} == {"one": 2, "two": 2}  # conversations 1 and 3 of each
    assert len({e["hermes"]["key"] for e in got}) == 6
    # n = 3, c = 2 per task: pass@1 = 2/3; pass@2 = 1 - C(1,2)/C(3,2) = 1; pass@3 = 1
    p = stats["task_statistics"]["pass_at_k"]
    assert math.isclose(p["1"], 2 / 3, abs_tol=1e-3) and p["2"] == 1.0 and p["3"] == 1.0


def test_a_run_of_three_attempts_sigkilled_mid_run_resumes_to_exactly_three_per_task(tmp_path, mock_llm,
                                                                                     default_image, docker_engine):
    import os
    import shutil
    import signal
    import subprocess
    import time

    from tests.conftest import containers_of
    from tests.data.test_harbor_tasks import DONE, TXT_TEST, entries, shell, task

    root = tmp_path / "tasks"
    slow_done = {**DONE, "sleep": 1.5}  # each attempt takes a while: the kill lands between its first and last
    for name in ("a", "b", "c"):
        task(root, name, f"Task {name}: write ok. " + script(*shell("echo ok > /app/out.txt"), slow_done), TXT_TEST)
    cmd = [shutil.which("hermes-batch") or "hermes-batch", "run", f"--dataset_file={root}", "--run_name=killed",
           f"--output_dir={tmp_path / 'data'}", f"--base_url={mock_llm.base_url}", "--model=mock-model",
           "--batch_size=1", "--num_workers=2", "--attempts=3", "--engine=direct", "--distribution=terminal_only",
           f"--sandbox_image={DEFAULT_IMAGE}"]
    journal = lambda: [e for e in entries(tmp_path, "killed") if e["hermes"]["status"] == "completed"]  # noqa: E731
    with open(tmp_path / "first.log", "wb") as out:
        first = subprocess.Popen(cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not journal() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert first.poll() is None and 0 < len(journal()) < 9, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert first.returncode == -signal.SIGKILL
    done = subprocess.run(cmd + ["--resume"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    finished = journal()
    keys = [e["hermes"]["key"] for e in finished]
    assert len(keys) == len(set(keys)) == 9  # no attempt twice
    per_task = {}
    for e in finished:
        per_task.setdefault(e["metadata"]["task"], []).append(e["hermes"].get("trial", 1))
    assert {t: sorted(v) for t, v in per_task.items()} == {n: [1, 2, 3] for n in ("a", "b", "c")}
    trajectories = read_jsonl(tmp_path / "data" / "killed" / "trajectories.jsonl")
    # trajectories.jsonl carries no attempt number (the ShareGPT line as before --attempts): three lines a task
    assert sorted(e["metadata"]["task"] for e in trajectories) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    assert containers_of(docker_engine, "killed") == []
