"""schemathesis against the running API server's own OpenAPI document, with every check it has
(`--checks all`): no 5xx, no answer that breaks the document, no body the document calls
valid refused or one it calls invalid accepted. Bounded in examples and time to stay fast; a
full-size run is a command away (see bench/ or the README's API section):

    st run http://127.0.0.1:8642/openapi.json -H 'Authorization: Bearer KEY' --checks all

The agent has no tools here: each fuzzed request is a model call to the scripted server, not
a container (the tools' own tests cover those), so thousands of requests fit in seconds.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hermes.api import create_app
from hermes.api.server import ServerThread
from mockllm import MockLLM
from tests.helpers import free_port, until
from tests.prefect_server import running_prefect_server
from tests.api.test_api_server import KEY, settings

REPO = Path(__file__).resolve().parents[2]


def schemathesis(url: str, report: Path, *args: str, timeout: float) -> tuple[int, str]:
    cmd = [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()", "run",
           f"{url}/openapi.json", "-H", f"Authorization: Bearer {KEY}", "--checks", "all",
           "--seed", "1601", "--no-color", "--report", "junit", "--report-junit-path", str(report), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=report.parent)
    return out.returncode, out.stdout + out.stderr


def cases(output: str) -> int:
    found = re.search(r"(\d+) generated", output)
    assert found, output[-3000:]
    return int(found.group(1))


#: seconds the coverage phase may take at most (it ends by itself once every operation is
#: covered): a bound against a hang, under the 300 s each schemathesis run is given
COVERAGE_BOUND = 240


def every_phase(url: str, tmp_path: Path, select: tuple[str, str], operations: int, examples: int,
                coverage_seconds: int) -> int:
    """schemathesis in two runs: the coverage phase within `coverage_seconds`, then fuzzing and
    stateful testing bounded by `examples` per operation. Asserts both pass, each phase on every
    selected operation; returns how many cases were sent.

    `--max-time` is a budget a run spends whole and shares among its phases, so one run with a
    short budget let the coverage phase (thousands of cases, unbounded by --max-examples) starve
    the others on a loaded machine. Bounded apart, no phase is left out. The coverage phase ends
    when it has covered every operation (6-10 s here), so its bound only catches a hang: at 6 s,
    next to other tests (pytest-xdist workers), it once left the last jobs operation untested, and
    at 30 s in a fresh-clone CI run it covered 1 of the 8 jobs operations (704 cases, about 40 ms
    each against the Prefect-backed API under the parallel suite). Run to its end, the jobs API's
    coverage takes about 80 s on a quiet machine; COVERAGE_BOUND leaves a loaded one the time.
    """
    sent = 0
    for phases, bound in (("coverage", ("--max-time", str(coverage_seconds))),
                          ("fuzzing,stateful", ("--max-examples", str(examples)))):
        code, output = schemathesis(url, tmp_path / f"junit-{phases.split(',')[0]}.xml", *select,
                                    "--phases", phases, *bound, timeout=300)
        assert code == 0, output[-6000:]
        assert f"Selected: {operations}/" in output and f"Tested: {operations}" in output, output[-3000:]
        for phase in phases.split(","):
            if phase == "stateful":
                found = re.search(r"✅  Stateful \(in [\d.]+s\)\s+Scenarios:\s+(\d+)", output)
                assert found and int(found.group(1)) >= 1, output[-3000:]
            else:
                found = re.search(rf"✅  {phase.title()} \(in [\d.]+s\)\s+✅ (\d+) passed", output)
                assert found and int(found.group(1)) == operations, f"{phase}: {output[-3000:]}"
        sent += cases(output)
    return sent


@pytest.mark.docker
def test_every_endpoint_but_jobs_holds_to_its_openapi_document(sandbox_image, tmp_path):
    with MockLLM() as mock:
        app = create_app(settings(mock, tmp_path, toolsets=[], max_turns=2, max_concurrent_runs=32,
                                  upstream_max_retries=0))
        with ServerThread(app) as srv:
            sent = every_phase(srv.url, tmp_path, ("--exclude-path-regex", "^/api/jobs"), operations=14,
                               examples=8, coverage_seconds=COVERAGE_BOUND)  # every operation outside /api/jobs
            # the server is still well: nothing it was sent broke it
            assert httpx.get(f"{srv.url}/health").status_code == 200
    assert sent > 150  # ~125 from fuzzing and stateful testing, the rest from coverage (~115 quiet, fewer when loaded: it is bounded by time)


@pytest.mark.prefect
@pytest.mark.docker
def test_the_prefect_backed_jobs_api_holds_to_its_openapi_document(sandbox_image, tmp_path):
    with running_prefect_server(tmp_path / "prefect") as prefect, MockLLM() as mock:
        port = free_port()
        env = {**prefect.env, "API_SERVER_KEY": KEY, "API_SERVER_PORT": str(port), "HERMES_HOME": str(tmp_path),
               "HERMES_BASE_URL": mock.base_url, "HERMES_MODEL": "mock-upstream", "PYTHONPATH": str(REPO)}
        log = tmp_path / "serve.log"
        with open(log, "wb") as out:  # no worker: jobs are made, changed, run (as flow runs) and deleted
            proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--log-level", "warning"], cwd=REPO,
                                    env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            def up() -> bool:
                assert proc.poll() is None, log.read_text()[-3000:]
                try:
                    return httpx.get(url + "/health/detailed", headers={"Authorization": f"Bearer {KEY}"},
                                     timeout=5).json()["readiness"]["checks"]["jobs"]["status"] == "ok"
                except httpx.HTTPError:
                    return False

            until(up, "hermes-batch serve with its jobs backend", timeout=180)
            sent = every_phase(url, tmp_path, ("--include-path-regex", "^/api/jobs"), operations=8, examples=4,
                               coverage_seconds=COVERAGE_BOUND)  # the jobs API's every operation
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert sent > 20  # ~50 from fuzzing and stateful testing, ~650 from coverage (quiet)
    assert "Exception in ASGI application" not in log.read_text()
