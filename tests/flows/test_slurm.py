"""--cluster slurm on a real Slurm (the one-machine cluster of deployments/slurm/local_cluster.sh):
the run's Dask workers are Slurm jobs submitted through dask-jobqueue, seen in squeue while the run
goes and gone after it; a worker job cancelled mid-batch has its batch rerun by another job without
its finished prompts; a flow process killed with SIGKILL leaves jobs that `hermes-batch sandbox
cleanup` cancels. The model is the bundled scripted server on loopback; the run folder and the
Docker engine are this machine's, which the jobs share."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from hermes.data import journal
from hermes.run import slurm as slurm_jobs
from hermes.sandbox.base import SandboxSettings
from hermes.settings import RunSettings
from mockllm import MockLLM
from tests.conftest import containers_of
from tests.helpers import read_jsonl, script, tool_responses, unique_run, until, write_dataset

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("dask_jobqueue")


def tool_free(i: int) -> str:
    return f"prompt {i} " + script({"reasoning": f"think {i}", "content": f"answer {i}"})


def settings_for(tmp_path: Path, dataset: Path, run_name: str, server: MockLLM, **kw) -> RunSettings:
    return RunSettings(dataset_file=str(dataset), run_name=run_name, output_dir=str(tmp_path / "data"),
                       base_url=server.base_url, model="mock-model", distribution="terminal_only",
                       cluster="slurm", slurm_scheduler_host="127.0.0.1", slurm_cores=2, slurm_memory="2GB",
                       slurm_walltime="00:15:00", **{"batch_size": 3, "num_workers": 2, "slurm_max_jobs": 2,
                          "max_no_tool_use_share": 1, **kw})  # prose answers: questions that merely offer tools


def run_jobs(run_name: str) -> list[slurm_jobs.Job]:
    return [j for j in slurm_jobs.jobs() if j.name == slurm_jobs.job_name(run_name)]


def job_state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), "gone")


def journal_lines(run_dir: Path) -> list[dict]:
    return [e for _, p in journal.batch_files(run_dir) for e in journal.read(p)]


def requests_by_prompt(server: MockLLM) -> Counter:
    return Counter(next(m["content"] for m in body["messages"] if m["role"] == "user")
                   for body in server.requests() if isinstance(body, dict))


def in_thread(fn) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["stats"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e
    runner = threading.Thread(target=target, daemon=True)
    runner.start()
    return runner, outcome


@pytest.mark.usefixtures("prefect_harness")
def test_a_run_on_slurm_jobs_completes_once_and_leaves_no_job(tmp_path, slurm, docker_engine, sandbox_image):
    from flows.batch import batch_run

    run_name = unique_run("slurm-run")
    prompts = [tool_free(i) for i in range(17)]
    prompts.append("in a container " + script(
        {"reasoning": "look", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo from-$((6*7))"}}]},
        {"reasoning": "seen", "content": "done"}))
    dataset = write_dataset(tmp_path / "d.jsonl", [{"prompt": p} for p in prompts])
    seen: dict[str, slurm_jobs.Job] = {}
    with MockLLM(latency=0.3) as server:
        settings = settings_for(tmp_path, dataset, run_name, server, sandbox=SandboxSettings(prefetch=False))
        runner, outcome = in_thread(lambda: batch_run(settings=settings))
        while runner.is_alive():
            seen.update({j.id: j for j in run_jobs(run_name)})
            runner.join(0.5)
    assert "error" not in outcome, outcome.get("error")

    run_dir = tmp_path / "data" / run_name
    assert seen, "no Slurm job of the run was ever in squeue"
    assert {j.owner for j in seen.values()} == {f"{socket.gethostname()}:{os.getpid()}"}  # the run's own process
    assert len(seen) <= 2 * 3, f"more jobs than slurm_max_jobs allows at once, thrice over: {sorted(seen)}"
    assert run_jobs(run_name) == [], "jobs of the run were left after it"
    assert outcome["stats"]["trajectories_written"] == 18 and outcome["stats"]["prompts_failed"] == 0
    out = read_jsonl(run_dir / "trajectories.jsonl")
    assert sorted(e["conversations"][1]["value"] for e in out) == sorted(prompts)  # each exactly once
    boxed = next(e for e in out if e["conversations"][1]["value"].startswith("in a container"))
    assert "from-42" in json.dumps(tool_responses(boxed))
    # every prompt ran in a worker process of a job, none in this one
    workers = {e["hermes"]["worker"] for e in journal_lines(run_dir)}
    assert f"{socket.gethostname()}:{os.getpid()}" not in workers
    assert list((run_dir / "slurm").glob(f"{slurm_jobs.job_name(run_name)}-*.err")), "no worker job's log"
    assert not containers_of(docker_engine, run_name)


@pytest.mark.usefixtures("prefect_harness")
def test_a_worker_job_cancelled_mid_batch_has_its_batch_rerun_without_its_finished_prompts(tmp_path, slurm):
    from flows.batch import batch_run

    run_name = unique_run("slurm-cancelled")
    prompts = [tool_free(i) for i in range(24)]
    dataset = write_dataset(tmp_path / "d.jsonl", [{"prompt": p} for p in prompts])
    run_dir = tmp_path / "data" / run_name
    with MockLLM(latency=0.4) as server:
        # one job at a time: the cancelled job's batch can only be finished by the job that replaces it
        settings = settings_for(tmp_path, dataset, run_name, server, sandbox=SandboxSettings(backend="local"),
                                batch_size=6, slurm_max_jobs=1)
        runner, outcome = in_thread(lambda: batch_run(settings=settings))

        def part_done() -> tuple[Path, str] | None:
            assert runner.is_alive(), f"the run ended before a job could be cancelled mid-batch: {outcome}"
            for _, path in journal.batch_files(run_dir):
                done = list(journal.read(path))
                if 1 <= len(done) < 6:
                    return path, done[0]["hermes"]["worker"]
            return None
        path, worker = until(part_done, "a batch part done by a worker job", timeout=300, every=0.05)
        cancelled = [j.id for j in run_jobs(run_name)]
        assert len(cancelled) == 1
        subprocess.run(["scancel", *cancelled], check=True)
        finished_before = {e["conversations"][1]["value"] for e in journal_lines(run_dir)}
        runner.join(400)
        assert not runner.is_alive(), "the run did not finish after its job was cancelled"
        calls = requests_by_prompt(server)
    assert "error" not in outcome, outcome.get("error")

    assert job_state(cancelled[0]) in ("CANCELLED", "gone")
    assert outcome["stats"]["trajectories_written"] == 24 and outcome["stats"]["prompts_failed"] == 0
    out = read_jsonl(run_dir / "trajectories.jsonl")
    assert sorted(e["conversations"][1]["value"] for e in out) == sorted(prompts)  # each exactly once
    # prompts finished before the cancel were never asked of the model again...
    assert finished_before and {p: calls[p] for p in finished_before} == {p: 1 for p in finished_before}
    # ...only those in flight in the cancelled job (at most num_workers) ran twice
    assert sum(1 for p in prompts if calls[p] > 1) <= 2
    batch = list(journal.read(path))
    assert len({e["hermes"]["key"] for e in batch}) == len(batch) == 6
    assert {e["hermes"]["worker"] for e in batch} - {worker}, "the cancelled batch was not finished by another job"
    assert run_jobs(run_name) == []


@contextlib.contextmanager
def flow_process(tmp_path: Path, run_name: str) -> Iterator[tuple[subprocess.Popen, list[slurm_jobs.Job], dict]]:
    """The batch-run flow in a process of its own, mid-run: its jobs running, a first prompt done."""
    from prefect.settings import PREFECT_API_URL

    dataset = write_dataset(tmp_path / "d.jsonl", [{"prompt": tool_free(i)} for i in range(60)])
    run_dir = tmp_path / "data" / run_name
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": PREFECT_API_URL.value()}
    with MockLLM(latency=1.0) as server:
        settings = settings_for(tmp_path, dataset, run_name, server, sandbox=SandboxSettings(backend="local"))
        flow = subprocess.Popen(
            [sys.executable, "-c", "import sys; from flows.batch import batch_run; from hermes.settings import "
             "RunSettings; batch_run(settings=RunSettings.model_validate_json(sys.argv[1]))",
             settings.model_dump_json()], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "flow.err", "wb"), start_new_session=True)  # noqa: SIM115 - the child's
        try:
            until(lambda: flow.poll() is None and journal_lines(run_dir), "the flow's first finished prompt",
                  timeout=300)
            jobs = run_jobs(run_name)
            assert jobs and {j.owner for j in jobs} == {f"{socket.gethostname()}:{flow.pid}"}
            yield flow, jobs, env
        finally:
            if flow.poll() is None:
                flow.kill()
                flow.wait(60)


@pytest.mark.usefixtures("prefect_harness")
def test_jobs_of_a_sigkilled_flow_process_are_cancelled_by_sandbox_cleanup(tmp_path, slurm):
    run_name = unique_run("slurm-killed")
    with flow_process(tmp_path, run_name) as (flow, jobs, env):
        flow.send_signal(signal.SIGKILL)
        flow.wait(60)
        cleanup = subprocess.run([sys.executable, "-m", "flows.cli", "sandbox", "cleanup"], env=env, cwd=ROOT,
                                 capture_output=True, text=True, timeout=300)
    assert cleanup.returncode == 0, cleanup.stderr
    assert "slurm job(s) of dead runs" in cleanup.stdout
    # cancelled by the cleanup, not ended by their workers losing the scheduler (that would be COMPLETED or FAILED)
    assert {job_state(j.id) for j in jobs} <= {"CANCELLED", "gone"}
    until(lambda: run_jobs(run_name) == [], "the cancelled jobs to leave squeue", timeout=60)


@pytest.mark.usefixtures("prefect_harness")
def test_a_flow_process_stopped_with_sigterm_cancels_its_jobs_itself(tmp_path, slurm):
    """SIGTERM is how a Prefect cancellation (and a terminal's kill) stops the flow's process."""
    run_name = unique_run("slurm-stopped")
    with flow_process(tmp_path, run_name) as (flow, jobs, _env):
        flow.send_signal(signal.SIGTERM)
        flow.wait(120)
        stderr = (tmp_path / "flow.err").read_text(errors="replace")
    assert flow.returncode != 0, stderr[-3000:]
    # no cleanup ran: the process cancelled them as it stopped
    assert {job_state(j.id) for j in jobs} <= {"CANCELLED", "gone"}, stderr[-3000:]
    until(lambda: run_jobs(run_name) == [], "the cancelled jobs to leave squeue", timeout=60)

def test_slurm_is_refused_where_it_cannot_run_and_an_unknown_cluster_is_named(tmp_path):
    from hermes.run import clusters, direct
    from hermes.run.rundir import RunRefused

    dataset = write_dataset(tmp_path / "d.jsonl", [{"prompt": "p"}])
    base = {"dataset_file": str(dataset), "batch_size": 1, "run_name": "refused", "output_dir": str(tmp_path / "data")}
    with pytest.raises(RunRefused, match="--engine direct .* cannot start Dask workers .*cluster slurm"):
        direct.run(RunSettings(**base, cluster="slurm"))
    with pytest.raises(RunRefused, match="cluster: 'slurm' .* cannot be combined with dask_address tcp://"):
        clusters.of(RunSettings(**base, cluster="slurm", dask_address="tcp://127.0.0.1:8786"))
    with pytest.raises(RunRefused, match="cluster: unknown cluster 'slurmm'; choose one of: local, slurm"):
        clusters.of(RunSettings(**base, cluster="slurmm"))
    assert not (tmp_path / "data").exists()  # refused before anything was made
