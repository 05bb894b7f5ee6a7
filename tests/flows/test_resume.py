"""Resume by content: nothing finished is lost or written twice, whatever happened to the last run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes.run import rundir
from mockllm import MockLLM
from hermes.run.status import run_status
from hermes.settings import RunSettings
from tests.conftest import containers_of
from tests.helpers import read_jsonl, script, unique_run, write_dataset

ROOT = Path(__file__).resolve().parents[2]
KILLED = unique_run("killed")  # its containers' label: no other test's "killed" run is counted


def first_turn_requests(server: MockLLM) -> list[str]:
    """The user prompt of every request that started a prompt's conversation, in arrival order."""
    out = []
    for body in server.requests():
        msgs = body["messages"]
        last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        if not any(m["role"] == "assistant" for m in msgs[last_user:]):
            out.append(msgs[last_user]["content"])
    return out


def journal_prompts(run_dir: Path) -> list[str]:
    """Prompts with a line in the batch files (torn last lines ignored, as resume does)."""
    from hermes.data import journal

    return [e["conversations"][1]["value"] for _, p in journal.batch_files(run_dir) for e in journal.read(p)]


# ------------------------------------------------------------------ killed anywhere, resumed each time

def test_sigkill_at_every_stage_then_resume_gives_each_prompt_once(tmp_path, sandbox_image, docker_engine):
    prompts = [f"slow prompt {i} " + script({"reasoning": "work", "sleep": 0.4,
                                            "tool_calls": [{"name": "terminal", "arguments": {"command": f"echo {i}"}}]},
                                           {"reasoning": "done", "content": f"answer {i}"}) for i in range(7)]
    dataset = write_dataset(tmp_path / "d.jsonl", [{"prompt": p} for p in prompts])
    run_dir = tmp_path / "data" / KILLED
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    with MockLLM() as server:
        def start(resume: bool) -> subprocess.Popen:
            cmd = [sys.executable, str(ROOT / "batch_runner.py"), "--dataset_file", str(dataset), "--batch_size", "3",
                   "--run_name", KILLED, "--base_url", server.base_url, "--model", "m", "--num_workers", "1"]
            return subprocess.Popen(cmd + (["--resume"] if resume else []), cwd=tmp_path, env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)

        def kill_when(proc: subprocess.Popen, condition, what: str) -> None:
            deadline = time.monotonic() + 180
            while not condition():
                assert proc.poll() is None, f"run ended before '{what}': {proc.stderr.read().decode()[-2000:]}"
                assert time.monotonic() < deadline, f"never reached '{what}'"
                time.sleep(0.01)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

        def lines_per_batch() -> list[int]:
            from hermes.data import journal
            return [sum(1 for _ in journal.read(p)) for _, p in journal.batch_files(run_dir)]

        kills: list[tuple[set[str], int]] = []  # (prompts with a line, requests seen) at each kill

        def record_kill():
            kills.append((set(journal_prompts(run_dir)), len(server.requests())))

        # 1. before the first prompt finishes
        proc = start(resume=False)
        kill_when(proc, lambda: len(server.requests()) >= 1 and not journal_prompts(run_dir), "first model call")
        record_kill()
        # 2. in the middle of a batch
        proc = start(resume=True)
        kill_when(proc, lambda: (lambda n: bool(n) and n[-1] == 1)(lines_per_batch()), "one line of a batch")
        record_kill()
        # 3. between batches: a batch complete and the next one not yet begun
        proc = start(resume=True)
        before = len(lines_per_batch())
        kill_when(proc, lambda: (lambda n: len(n) > before and n[-1] == 3)(lines_per_batch()), "a full batch")
        record_kill()
        # 4. after the last prompt, while recording and merging
        proc = start(resume=True)
        kill_when(proc, lambda: len(set(journal_prompts(run_dir))) == 7, "every prompt done")
        record_kill()
        # 5. to the end
        proc = start(resume=True)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-3000:]

        entries = read_jsonl(run_dir / "trajectories.jsonl")
        assert sorted(e["conversations"][1]["value"] for e in entries) == sorted(prompts)  # each exactly once
        assert sorted(journal_prompts(run_dir)) == sorted(prompts)  # and the journal holds no duplicate either
        starts = first_turn_requests(server)
        for done_before, seen in kills:
            rerun = {p for p in starts[_first_turn_index(server, seen):] if p in done_before}
            assert not rerun, f"prompts finished before a kill ran again: {sorted(rerun)}"
        stats = json.loads((run_dir / "statistics.json").read_text())
        assert stats["trajectories_written"] == 7
        checkpoint = json.loads((run_dir / "checkpoint.json").read_text())
        assert checkpoint["completed_prompts"] == list(range(7))
    assert containers_of(docker_engine, KILLED) == []


def _first_turn_index(server: MockLLM, request_count: int) -> int:
    """How many first-turn requests were among the first `request_count` requests."""
    n = 0
    for body in server.requests()[:request_count]:
        msgs = body["messages"]
        last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        n += not any(m["role"] == "assistant" for m in msgs[last_user:])
    return n


# ------------------------------------------------------------------ resume does exactly the work that is left

@pytest.fixture
def run(tmp_path, sandbox_image, prefect_harness):
    from flows.batch import batch_run

    def _run(server: MockLLM, rows: list[dict], **kw) -> dict:
        dataset = write_dataset(tmp_path / "d.jsonl", rows)
        settings = RunSettings(dataset_file=str(dataset), run_name="resumable", output_dir=str(tmp_path / "data"),
                               base_url=server.base_url, model="m", batch_size=2, num_workers=3, max_retries=0,
                               **{"max_failed_share": 1.0, **kw})  # failures here are on purpose
        return batch_run(settings=settings)
    _run.dir = tmp_path / "data" / "resumable"
    return _run


def prompts_of(run_dir: Path) -> list[str]:
    return sorted(e["conversations"][1]["value"] for e in read_jsonl(run_dir / "trajectories.jsonl"))


def test_reordered_dataset_costs_nothing_and_an_appended_row_costs_one(run):
    rows = [{"prompt": f"q{i}"} for i in range(5)]
    with MockLLM() as server:
        run(server, rows)
        calls = len(server.requests())
        run(server, list(reversed(rows)), resume=True)
        assert len(server.requests()) == calls  # nothing re-run
        assert prompts_of(run.dir) == [f"q{i}" for i in range(5)]
        checkpoint = json.loads((run.dir / "checkpoint.json").read_text())
        assert checkpoint["completed_prompts"] == list(range(5))

        run(server, list(reversed(rows)) + [{"prompt": "q-new"}], resume=True)
        assert set(first_turn_requests(server)[5:]) == {"q-new"} and len(first_turn_requests(server)) == 6
        assert prompts_of(run.dir) == sorted([f"q{i}" for i in range(5)] + ["q-new"])


def test_identical_prompts_each_need_their_own_completion(run):
    with MockLLM() as server:
        run(server, [{"prompt": "same"}, {"prompt": "other"}, {"prompt": "same"}, {"prompt": "same"}])
        assert prompts_of(run.dir) == ["other", "same", "same", "same"]
        run(server, [{"prompt": "same"}] * 4 + [{"prompt": "other"}], resume=True)  # one more "same" is owed
        assert first_turn_requests(server).count("same") == 4
        assert prompts_of(run.dir) == ["other"] + ["same"] * 4


def test_failed_prompt_runs_again_on_resume_and_attempts_are_counted(run):
    with MockLLM(fail_first=1, error_status=500) as server:  # each conversation's first request fails
        # prompt_retries=0: no retry within the run, so the failures stand until the resume
        stats = run(server, [{"prompt": "flaky"}, {"prompt": "steady"}], prompt_retries=0)
        assert stats["prompts_failed"] == 2 and stats["trajectories_written"] == 0
        status = run_status(run.dir)
        assert (status["failed"], status["failed_attempts"], status["owed"]) == (2, 2, 2)
        assert status["failure_reasons"]["model endpoint 500"]["count"] == 2
        stats = run(server, [{"prompt": "flaky"}, {"prompt": "steady"}], resume=True, prompt_retries=0)
        assert stats["prompts_failed"] == 0 and stats["trajectories_written"] == 2
        assert run_status(run.dir)["owed"] == 0


def test_max_attempts_gives_up_on_a_prompt_that_always_fails(run):
    rows = [{"prompt": "doomed " + script({"error": 500})}, {"prompt": "fine"}]
    with MockLLM() as server:
        run(server, rows, max_attempts=2)
        run(server, rows, resume=True, max_attempts=2)
        calls = len(server.requests())
        stats = run(server, rows, resume=True, max_attempts=2)
        assert len(server.requests()) == calls  # given up after two attempts
        assert stats["prompts_failed"] == 1 and stats["trajectories_written"] == 1


def test_damaged_derived_files_are_rebuilt_from_the_batch_files(run):
    rows = [{"prompt": f"d{i}"} for i in range(4)]
    with MockLLM() as server:
        run(server, rows)
        calls = len(server.requests())
        (run.dir / "checkpoint.json").write_text("{ this is not json")
        (run.dir / "index.duckdb").write_bytes(b"garbage" * 1000)
        (run.dir / "trajectories.jsonl").write_text("")
        # and a torn last line, as a crash in the middle of a write leaves it
        with open(run.dir / "batch_0.jsonl", "a") as f:
            f.write('{"prompt_index": 0, "conversations": [')
        stats = run(server, rows, resume=True)
        assert len(server.requests()) == calls
        assert stats["trajectories_written"] == 4 and prompts_of(run.dir) == [f"d{i}" for i in range(4)]
        assert json.loads((run.dir / "checkpoint.json").read_text())["completed_prompts"] == [0, 1, 2, 3]


def test_an_existing_run_without_resume_is_refused_and_keeps_its_results(run):
    with MockLLM() as server:
        run(server, [{"prompt": "a"}])
        before = (run.dir / "trajectories.jsonl").read_text()
        with pytest.raises(rundir.RunRefused, match="--resume"):
            run(server, [{"prompt": "a"}])
        assert (run.dir / "trajectories.jsonl").read_text() == before


def test_two_runs_of_the_same_name_at_once_are_refused(run):
    with MockLLM() as server:
        lock = rundir.RunLock(run.dir)
        lock.acquire()  # another invocation holds the run
        try:
            with pytest.raises(rundir.RunRefused, match="in use"):
                run(server, [{"prompt": "a"}])
        finally:
            lock.release()


# ------------------------------------------------------------------ planning: a join, not a pass over Python rows

def test_plan_owes_only_rows_without_a_success_and_checkpoints_the_rest(tmp_path):
    from hermes.data.dataset import read_dataset
    from hermes.run.session import RunSession

    dataset = write_dataset(tmp_path / "d.jsonl", [{"prompt": p} for p in ["a", "b", "a", "c", "d", "e"]])
    keys = read_dataset(dataset).keys()
    run_dir = tmp_path / "data" / "planned"
    run_dir.mkdir(parents=True)

    def journal_file(num: int, outcomes: list[tuple[int, str]]) -> None:
        (run_dir / f"batch_{num}.jsonl").write_text("".join(json.dumps(
            {"prompt_index": i, "conversations": [], "api_calls": 1, "tool_stats": {},
             "hermes": {"key": keys[i], "status": status, "error": None if status != "failed" else "boom"}}) + "\n"
            for i, status in outcomes))

    # the first "a" done; "b" failed twice (given up at max_attempts=2); the second "a" failed once;
    # "c" discarded for want of reasoning (it ran: done); "e" failed, then done on a resume
    journal_file(0, [(0, "completed"), (1, "failed"), (2, "failed"), (5, "failed")])
    journal_file(1, [(1, "failed"), (3, "discarded"), (5, "partial")])
    settings = RunSettings(dataset_file=str(dataset), run_name="planned", output_dir=str(tmp_path / "data"),
                           batch_size=1, resume=True, max_attempts=2, sandbox={"backend": "local"})
    session = RunSession.open(settings, api_key="unused")
    try:
        batches = session.plan()  # walked while the run's index is open, as a run walks it
        planned = [(b.num, [(r.index, r.row.prompt, r.key) for r in b.rows]) for b in batches]
    finally:
        session.close()
    assert len(batches) == 2 and batches.prompts == 2
    assert planned == [
        (2, [(2, "a", keys[2])]), (3, [(4, "d", keys[4])])]
    text = (run_dir / "checkpoint.json").read_text()
    checkpoint = json.loads(text)
    assert list(checkpoint) == ["run_name", "completed_prompts", "batch_stats", "last_updated"]
    assert checkpoint["completed_prompts"] == [0, 3, 5]
    assert '"completed_prompts": [0,3,5],' in text  # one line, however many prompts
    assert checkpoint["batch_stats"] == {"0": {"processed": 4, "skipped": 3, "discarded_no_reasoning": 0},
                                         "1": {"processed": 3, "skipped": 1, "discarded_no_reasoning": 1}}
