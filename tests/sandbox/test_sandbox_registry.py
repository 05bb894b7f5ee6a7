"""Sandbox backends as a registry: a backend is one module that registers itself, and every
caller (a batch run, its end, the API server's reaper) reaches it through its lifecycle hooks.

The example backend here is not shipped: it runs commands with the tests' ShellBox (a real
shell in a temporary folder) and writes down which hooks the run called.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.sandbox import SandboxBackend, SandboxSettings, SandboxSpec, backend_names, get_backend, register
from hermes.sandbox import registry
from tests._shellbox import ShellBox
from tests.conftest import containers_of
from tests.helpers import read_jsonl, script, tool_responses, write_dataset

ROOT = Path(__file__).resolve().parents[2]
NAME = "pytest-shellbox"


class ShellBackend(SandboxBackend):
    """All a new backend needs: a name, open(), and whichever lifecycle hooks it has."""

    name = NAME
    calls: list[tuple[str, str]] = []
    opened: list[ShellBox] = []

    def open(self, spec: SandboxSpec) -> ShellBox:
        box = ShellBox(command_timeout=self.settings.command_timeout)
        self.opened.append(box)
        return box

    def prepare_run(self, run_id: str) -> list[str]:
        self.calls.append(("prepare_run", run_id))
        return []

    def guard_run(self, run_id: str):
        self.calls.append(("guard_run", run_id))
        return lambda: self.calls.append(("guard released", run_id))

    def end_run(self, run_id: str, timeout: float) -> None:
        self.calls.append(("end_run", run_id))


@pytest.fixture
def shell_backend():
    register(ShellBackend)  # what the one import line in hermes/sandbox/__init__.py does for a shipped one
    ShellBackend.calls, ShellBackend.opened = [], []
    yield ShellBackend
    registry._BACKENDS.pop(NAME, None)


@pytest.fixture(scope="module")
def llm():
    from mockllm import MockLLM

    with MockLLM() as server:
        yield server


def test_settings_accept_exactly_the_registered_names(shell_backend):
    assert backend_names()[:2] == ("docker", "local")
    assert isinstance(get_backend(SandboxSettings(backend=NAME)), ShellBackend)
    assert NAME in SandboxSettings.model_json_schema()["properties"]["backend"]["enum"]
    with pytest.raises(ValueError, match="Input should be 'docker' or 'local' or 'runc' or 'pytest-shellbox'"):
        SandboxSettings(backend="kubernetes")


def test_a_run_on_a_new_backend_goes_through_its_lifecycle(shell_backend, llm, tmp_path):
    from hermes.run import direct
    from hermes.settings import RunSettings

    prompt = script({"reasoning": "Look.", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo from-$((40+2))"}}]},
                    {"reasoning": "Seen.", "content": "Done."})
    dataset = write_dataset(tmp_path / "p.jsonl", [{"prompt": prompt}])
    run = f"registry-{secrets.token_hex(3)}"
    settings = RunSettings(dataset_file=str(dataset), run_name=run, output_dir=str(tmp_path), base_url=llm.base_url,
                           model="mock-model", batch_size=1, num_workers=1, sandbox=SandboxSettings(backend=NAME))
    direct.run(settings, api_key="test")

    [entry] = read_jsonl(tmp_path / run / "trajectories.jsonl")
    assert entry["completed"] is True
    assert "from-42" in json.dumps(tool_responses(entry))  # the command ran in the new backend's sandbox
    assert shell_backend.calls == [("prepare_run", run), ("guard_run", run), ("end_run", run), ("guard released", run)]
    assert len(shell_backend.opened) == 1 and not os.path.exists(shell_backend.opened[0].root)  # closed


def test_the_api_servers_reaper_removes_only_dead_servers_containers(tmp_path, sandbox_image, docker_engine,
                                                                   monkeypatch):
    from hermes.api.server_settings import ApiSettings
    from hermes.api.service import API_LABEL, AgentService
    from hermes.sandbox.base import LABEL_PROMPT, LABEL_RUN

    run = f"api-reap-{secrets.token_hex(3)}"
    labels = {LABEL_RUN: run, API_LABEL: "1"}
    code = ("from hermes.sandbox import open_sandbox\nfrom hermes.sandbox.base import SandboxSettings, SandboxSpec\n"
            f"open_sandbox(SandboxSpec(image={sandbox_image!r}, labels={labels | {LABEL_PROMPT: 'dead'}!r}), SandboxSettings())\n"
            "import os; os._exit(0)  # a server that dies without removing its request's container\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
    live = get_backend().open(SandboxSpec(image=sandbox_image, labels=labels | {LABEL_PROMPT: "live"}))
    service = AgentService(ApiSettings(store_path=tmp_path / "r.sqlite3"))
    try:
        before = {c.id for c in containers_of(docker_engine, run)}
        assert live.container_id in before
        # The reaper looks at every API container on the engine; here it is shown only this test's
        # run, so it cannot remove a dead server's container another test (or checkout) is looking at.
        engine_wide = service.backend.leftovers
        monkeypatch.setattr(service.backend, "leftovers",
                            lambda run_id=None, *, label=None: engine_wide(run_id or run, label=label))
        # Another API server starting beside this test (the parallel suite) reaps the dead one too,
        # as it should: ours must then have nothing of this run left to remove, and never the live one.
        dead_still_there = len(before) == 2
        removed = service.reap_orphans()
        assert (1 if dead_still_there else 0) <= removed <= 1  # none of another run's
        assert [c.id for c in containers_of(docker_engine, run)] == [live.container_id]
    finally:
        service.close()
        live.close()
        for c in containers_of(docker_engine, run):
            c.remove(force=True)
