"""`hermes-batch verify PATH`: each task's reference solution (the "oracle") instead of a model.

Per task, in a sandbox made as a run makes it (the image built or found, the task's profile and
limits under the run's ceilings): solution/ is copied to /solution and `bash /solution/solve.sh`
runs in the image's WORKDIR within the agent's time limit, then the verifier as after an agent
(hermes.data.verifier). A task whose oracle does not pass is named, with why.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from hermes.data.harbor import read_tasks
from hermes.data.verifier import Verifier, copy_folder, make_logs
from hermes.run.task_rows import limits, resolve_image
from hermes.sandbox import SandboxError, SandboxSpec, get_backend
from hermes.settings import RunSettings

log = logging.getLogger(__name__)


@dataclass
class OracleResult:
    task: str
    passed: bool
    reward: float | None
    reason: str | None
    seconds: float


def verify(settings: RunSettings) -> tuple[list[OracleResult], list[str]]:
    """(each task's oracle outcome, the bad task folders skipped)."""
    ds = read_tasks(settings.dataset_file, max_samples=settings.max_samples, skip_bad=True)
    backend = get_backend(settings.sandbox)
    run_id = f"verify-{settings.run_name}"
    with backend.open_run(run_id):
        with ThreadPoolExecutor(max_workers=settings.num_workers) as pool:
            results = list(pool.map(lambda task: _oracle(task.row(), settings, backend, run_id), ds.tasks))
    return results, ds.problems


def _oracle(row, s: RunSettings, backend, run_id: str) -> OracleResult:
    folder = row.task_folder
    started = time.monotonic()
    if folder.solution is None:
        return OracleResult(folder.name, False, None, "no solution/solve.sh", 0.0)
    box = None
    try:
        image = resolve_image(row, backend, s)
        profile, lifetime, check_timeout = limits(folder, s)
        box = backend.open(SandboxSpec(image=image, profile=profile, lifetime=lifetime, run_id=run_id,
                                       prompt_id=folder.name))
        make_logs(box)
        copy_folder(box, folder.solution, "/solution")
        solve = box.exec("bash /solution/solve.sh", timeout=folder.agent_timeout or s.prompt_timeout)
        if solve.timed_out:
            return OracleResult(folder.name, False, None, "solve.sh did not finish in time", time.monotonic() - started)
        reward = Verifier(folder.tests, check_timeout, network=s.sandbox.network or s.verifier_network,
                          own_network=s.verifier_network and not s.sandbox.network).judge(box)
        reason = None if reward.passed else f"{reward.reason}; solve.sh exited {solve.exit_code}: {solve.output.strip()[-300:]}"
        return OracleResult(folder.name, reward.passed, reward.value, reason, time.monotonic() - started)
    except SandboxError as e:
        return OracleResult(folder.name, False, None, str(e), time.monotonic() - started)
    finally:
        if box is not None:
            box.close()


def format_results(results: list[OracleResult], problems: list[str]) -> str:
    lines = [f"{'pass' if r.passed else 'FAIL'}  {r.task}  ({r.seconds:.1f}s, reward {r.reward})"
             + ("" if r.passed else f"\n      {r.reason}") for r in results]
    lines += [f"BAD   {p}" for p in problems]
    failed = [r.task for r in results if not r.passed]
    lines.append(f"{len(results) - len(failed)} of {len(results)} oracle(s) pass"
                 + (f"; failing: {', '.join(failed)}" if failed else ""))
    return "\n".join(lines)
