"""--sandbox_runtime: a run under gVisor (runsc) completes in gVisor's own kernel; a run naming a
runtime the engine lacks is refused before any prompt runs. (The abuse suite, tests/sandbox/test_abuse.py,
runs under runsc too.)"""
from __future__ import annotations

import os

import pytest

from hermes.run import direct
from hermes.run.rundir import RunRefused
from hermes.sandbox.base import SandboxSettings
from tests.conftest import containers_of
from tests.helpers import unique_run, script, tool_responses
from tests.run.test_row_setup_checks import DONE, journal, settings, terminal

GVISOR = unique_run("gvisor")  # its containers' label: unique on a shared engine
NO_RUNTIME = unique_run("no-runtime")  # its containers' label: unique on a shared engine


def test_a_run_under_runsc_completes_in_gvisors_kernel(tmp_path, mock_llm, sandbox_image, runsc, docker_engine):
    rows = [{"prompt": f"Kernel {i}. " + script(terminal("uname -r; id -u"), DONE), "case": f"k{i}",
             "check": "test \"$(uname -r)\" != \"$HOST_KERNEL\"".replace("$HOST_KERNEL", os.uname().release)}
            for i in range(2)]
    s = settings(tmp_path, rows, GVISOR, mock_llm.base_url, sandbox=SandboxSettings(image=sandbox_image, runtime=runsc))
    stats = direct.run(s)
    entries = journal(tmp_path, GVISOR)
    assert stats["trajectories_written"] == 2 and stats["prompts_failed"] == 0
    for e in entries.values():
        kernel, uid = tool_responses(e)[0]["content"]["output"].split()
        assert kernel != os.uname().release and uid == "65534"  # not the host's kernel: gVisor's
        assert e["reward"]["passed"] is True
    assert containers_of(docker_engine, GVISOR) == []


def test_a_runtime_the_engine_lacks_is_refused(tmp_path, mock_llm, sandbox_image, docker_engine):
    rows = [{"prompt": "Never run. " + script(terminal("true"), DONE), "case": "x"}]
    s = settings(tmp_path, rows, NO_RUNTIME, mock_llm.base_url,
                 sandbox=SandboxSettings(image=sandbox_image, runtime="hermes-no-such-runtime"))
    with pytest.raises(RunRefused, match="the Docker engine has no container runtime 'hermes-no-such-runtime' "
                                         r"\(it has: .*runc"):
        direct.run(s)
    assert mock_llm.requests() == []  # refused before any prompt ran
    assert containers_of(docker_engine, NO_RUNTIME) == []
