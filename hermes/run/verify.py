"""`hermes-batch verify PATH`: each task's reference solution (the "oracle") instead of a model.

Per task, in a sandbox made as a run makes it (the image built or found, the task's profile, and
the resources and times its task.toml asks: hermes.run.task_limits): solution/ is copied to
/solution and `bash /solution/solve.sh` runs in the image's WORKDIR within the agent's time limit,
then the verifier as after an agent (hermes.data.verifier). A task whose oracle does not pass is
named, with why and the tail of what solve.sh and tests/test.sh printed (the whole kept tail in
--json): the verdict alone does not say whether the solution, the tests or the sandbox is at fault.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from pydantic import BaseModel

from hermes.data.harbor import read_tasks
from hermes.data.verifier import OUTPUT, Verifier, copy_folder, make_logs
from hermes.run.task_limits import summary, task_limits
from hermes.run.task_rows import capacity_of, resolve_image
from hermes.sandbox import SandboxError, SandboxSpec, get_backend
from hermes.settings import RunSettings

log = logging.getLogger(__name__)


#: lines of each output shown under a failing task (--json carries the whole kept tail)
SHOWN_LINES = 15


class Output(BaseModel):
    """What one script printed (stdout and stderr together): its exit code and the end of it."""

    exit_code: int | None = None  # None: it never ran, or ran out of time
    tail: str = ""  # its last hermes.data.verifier.OUTPUT characters
    timed_out: bool = False


class OracleResult(BaseModel):
    task: str
    passed: bool
    reward: float | None
    reason: str | None
    seconds: float
    solve: Output | None = None  # solution/solve.sh
    tests: Output | None = None  # tests/test.sh


def verify(settings: RunSettings) -> tuple[list[OracleResult], list[str], str]:
    """(each task's oracle outcome, the bad task folders skipped, one line on what the tasks ask
    and get: hermes.run.task_limits.summary)."""
    ds = read_tasks(settings.dataset_file, max_samples=settings.max_samples, skip_bad=True)
    backend = get_backend(settings.sandbox)
    run_id = f"verify-{settings.run_name}"
    rows = [task.row() for task in ds.tasks]
    asked = summary([row.task_folder for row in rows], settings, capacity_of(backend))
    with backend.open_run(run_id):
        with ThreadPoolExecutor(max_workers=settings.num_workers) as pool:
            results = list(pool.map(lambda row: _oracle(row, settings, backend, run_id), rows))
    return results, ds.problems, asked


def _oracle(row, s: RunSettings, backend, run_id: str) -> OracleResult:
    folder = row.task_folder
    started = time.monotonic()
    if folder.solution is None:
        return OracleResult(task=folder.name, passed=False, reward=None, reason="no solution/solve.sh", seconds=0.0)
    box = None
    try:
        image = resolve_image(row, backend, s)
        got = task_limits(folder, s, capacity_of(backend))
        box = backend.open(SandboxSpec(image=image, profile=got.profile, lifetime=got.lifetime, run_id=run_id,
                                       prompt_id=folder.name))
        make_logs(box)
        copy_folder(box, folder.solution, "/solution")
        res = box.exec("bash /solution/solve.sh", timeout=got.agent_timeout or s.prompt_timeout)
        solve = Output(exit_code=None if res.timed_out else res.exit_code, tail=_tail(res.output),
                       timed_out=res.timed_out)
        if res.timed_out:
            return OracleResult(task=folder.name, passed=False, reward=None, reason="solve.sh did not finish in time",
                                seconds=time.monotonic() - started, solve=solve)
        reward = Verifier(folder.tests, got.verifier_timeout, network=s.sandbox.network or s.verifier_network,
                          own_network=s.verifier_network and not s.sandbox.network).judge(box)
        tests = Output(exit_code=None if reward.timed_out or reward.exit_code < 0 else reward.exit_code,
                       tail=reward.output, timed_out=reward.timed_out)
        return OracleResult(task=folder.name, passed=reward.passed, reward=reward.value,
                            reason=None if reward.passed else reward.reason, seconds=time.monotonic() - started,
                            solve=solve, tests=tests)
    except SandboxError as e:
        return OracleResult(task=folder.name, passed=False, reward=None, reason=str(e),
                            seconds=time.monotonic() - started)
    finally:
        if box is not None:
            box.close()


def _tail(text: str) -> str:
    return text if len(text) <= OUTPUT else "[...]" + text[-OUTPUT:]


def _shown(name: str, out: Output | None) -> list[str]:
    """A failing task's script: how it ended and its last lines, indented under the task."""
    if out is None:
        return []
    ended = ("ran out of time" if out.timed_out else f"exited {out.exit_code}" if out.exit_code is not None
             else "did not run")
    lines = out.tail.rstrip().splitlines()
    if not lines:
        return [f"      {name} {ended}, printing nothing"]
    more = f" (last {SHOWN_LINES} of {len(lines)} lines)" if len(lines) > SHOWN_LINES else ""
    return [f"      {name} {ended}{more}:"] + [f"      | {line}" for line in lines[-SHOWN_LINES:]]


def format_results(results: list[OracleResult], problems: list[str]) -> str:
    lines = []
    for r in results:
        lines.append(f"{'pass' if r.passed else 'FAIL'}  {r.task}  ({r.seconds:.1f}s, reward {r.reward})")
        if not r.passed:
            lines += [f"      {r.reason}", *_shown("solution/solve.sh", r.solve), *_shown("tests/test.sh", r.tests)]
    lines += [f"BAD   {p}" for p in problems]
    failed = [r.task for r in results if not r.passed]
    lines.append(f"{len(results) - len(failed)} of {len(results)} oracle(s) pass"
                 + (f"; failing: {', '.join(failed)}" if failed else ""))
    return "\n".join(lines)
