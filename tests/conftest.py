"""Shared fixtures: the real parts every end-to-end test needs.

- Prefect: one session-scoped test harness (a real embedded Prefect server and engine).
- PREFECT_HOME: a folder of this session's own, inherited by every command the tests start, so
  CLI runs on the default path share one background Prefect server (flows/local_server.py),
  which the session stops at its end: a test run leaves no server behind.
- Docker: the real engine; in CI (CI=true) a missing engine fails the tests, never skips them.
- Under CI every skip or xfail, wherever it comes from (a fixture, a mark, importorskip), is
  reported as a failure: a suite that skipped what it could not run must not pass. .ci/run counts them.
- The bundled scripted model server on a loopback port.
- Sandboxes: the small busybox image (hermes-sandbox-mini) is the suite's default image
  ($HERMES_SANDBOX_IMAGE, inherited by the commands tests start), so most tests need no Debian
  build; a test that needs the real default (Debian with python3) asks for `default_image`.
  Tests never build the default image (its recipes pull from a registry or a Debian mirror): the
  set-up step does (deployments/bootstrap.sh); a test that finds it missing fails and names the command.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Before Prefect is imported (it reads PREFECT_HOME once); never the user's own ~/.prefect.
# Test modules also import this file as tests.conftest, a second module: both must name one folder.
# Under pytest-xdist every worker is a session of its own, started with the controller's environment:
# the variable's name carries the worker's id, so each worker makes (and at its end stops and removes)
# a home of its own, and no process ever stops another's background server.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_SESSION_HOME_ENV = "HERMES_TEST_SESSION_PREFECT_HOME" + (f"_{_WORKER}" if _WORKER else "")
SESSION_PREFECT_HOME = Path(os.environ.get(_SESSION_HOME_ENV) or tempfile.mkdtemp(prefix=f"hermes-test-prefect-home-{_WORKER or 'main'}-"))
os.environ[_SESSION_HOME_ENV] = os.environ["PREFECT_HOME"] = str(SESSION_PREFECT_HOME)

from flows.prefect_env import configure_prefect  # noqa: E402

configure_prefect()

from hermes.sandbox.base import IMAGE_ENV, MINI_IMAGE  # noqa: E402

os.environ.setdefault(IMAGE_ENV, MINI_IMAGE)

UNDER_CI = bool(os.environ.get("CI"))
SKIPPED_UNDER_CI = "skipped under CI"  # .ci/run counts reports whose failure starts with this


def pytest_sessionfinish(session, exitstatus):
    """Stop the background Prefect server the session's CLI runs started (if any), then forget its home."""
    from flows import local_server

    local_server.stop(SESSION_PREFECT_HOME)
    shutil.rmtree(SESSION_PREFECT_HOME, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if UNDER_CI and report.skipped:  # an xfail too: a required part that cannot run is a failure
        reason = getattr(report, "wasxfail", "") or (report.longrepr[2] if isinstance(report.longrepr, tuple)
                                                      else str(report.longrepr))
        report.outcome = "failed"
        report.longrepr = f"{SKIPPED_UNDER_CI}: {reason}"
        if hasattr(report, "wasxfail"):
            del report.wasxfail


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if UNDER_CI and report.skipped:  # a module-level skip would hide every test in the file
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"{SKIPPED_UNDER_CI}: {reason}"


def docker_client_or_none():
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
        return client
    except Exception:
        return None


@pytest.fixture(scope="session")
def docker_engine():
    client = docker_client_or_none()
    if client is None:
        if UNDER_CI:
            pytest.fail("no Docker engine answers; .ci/run must start one (deployments/bootstrap.sh)")
        pytest.skip("no Docker engine answers (run deployments/bootstrap.sh)")
    yield client
    client.close()


@pytest.fixture(scope="session")
def sandbox_image(request, docker_engine):
    """The suite's default sandbox image (the busybox one unless $HERMES_SANDBOX_IMAGE says); the
    busybox one is built if missing (offline, a second), the default one never (`default_image`)."""
    from hermes.sandbox.image import DEFAULT_TAG, PRODUCT_IMAGES, ensure_image_built

    image = os.environ[IMAGE_ENV]
    if image == DEFAULT_TAG:
        return request.getfixturevalue("default_image")
    return ensure_image_built(image) if image in PRODUCT_IMAGES else image


DEFAULT_IMAGE_COMMAND = "python3 -m hermes.sandbox.image ensure --tag hermes-sandbox:bookworm"


@pytest.fixture(scope="session")
def default_image(docker_engine):
    """The product's real default image (Debian with python3, git), as the set-up step built it.

    Never built here: its recipes pull from a registry or debootstrap from a Debian mirror, and
    tests do not reach off the machine. Missing, it fails (not skips) and names the command.
    """
    from hermes.sandbox.image import DEFAULT_TAG, PRODUCT_IMAGES, recipe_of

    found = recipe_of(DEFAULT_TAG, docker_engine)
    if found not in PRODUCT_IMAGES[DEFAULT_TAG]:
        state = "is missing" if found is None else f"was not made by one of its recipes ({found or 'no recipe label'})"
        pytest.fail(f"the default sandbox image {DEFAULT_TAG} {state}: build it with `{DEFAULT_IMAGE_COMMAND}` "
                    "(deployments/bootstrap.sh runs it)")
    return DEFAULT_TAG


RUNSC = "runsc"


@pytest.fixture(scope="session")
def runsc(docker_engine, sandbox_image):
    """The gVisor runtime's name, once the engine has it and can start a sandbox under it.

    Not registered: skipped with the engine's list of runtimes. Registered but unable to start a
    container here (a kernel or platform gVisor cannot run on): xfail with the engine's own answer.
    Under CI, whose .ci/run installs and registers it, either is a failure: gVisor is required there.
    """
    runtimes = sorted((docker_engine.info().get("Runtimes") or {}))
    if RUNSC not in runtimes:
        pytest.skip(f"the Docker engine has no {RUNSC} runtime (it has: {', '.join(runtimes)}); "
                    "HERMES_INSTALL_RUNSC=1 bash deployments/bootstrap.sh registers it")
    import docker.errors

    try:
        docker_engine.containers.run(sandbox_image, ["true"], runtime=RUNSC, network_mode="none", remove=True,
                                     labels={"hermes-batch.test": "runsc-probe"})
    except docker.errors.DockerException as e:
        why = f"{RUNSC} is registered but cannot start a container on this machine: {getattr(e, 'explanation', None) or e}"
        for left in docker_engine.containers.list(all=True, filters={"label": "hermes-batch.test=runsc-probe"}):
            left.remove(force=True)  # a probe that never started stays "Created": remove=True does not reach it
        if UNDER_CI:
            pytest.fail(why)
        pytest.xfail(why)
    return RUNSC


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def mock_llm():
    from mockllm import MockLLM

    with MockLLM() as server:
        yield server


def containers_of(client, run_name: str):
    return client.containers.list(all=True, sparse=True, filters={"label": f"hermes-batch.run={run_name}"})


@pytest.fixture(scope="session")
def slurm():
    """The one-machine Slurm cluster of deployments/slurm/local_cluster.sh (slurmctld and slurmd on
    this host), started when it is not up; .ci/run starts it after bootstrap."""
    import subprocess

    if not shutil.which("sbatch"):
        pytest.skip("no Slurm here: run `bash deployments/slurm/local_cluster.sh start`")
    script = Path(__file__).resolve().parent.parent / "deployments" / "slurm" / "local_cluster.sh"
    started = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True, timeout=300)
    if started.returncode:
        pytest.skip(f"the local Slurm cluster did not start: {started.stderr[-2000:]}")
    return "slurm"
