"""The HERMES_* variables: one model (hermes/environment.py) that every reader goes through, read when
asked, validated, listed by `hermes-batch env` and in the README."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from hermes.environment import Environment, EnvironmentInvalid, environment, names, read

ROOT = Path(__file__).resolve().parent.parent
VARIABLES = [v for f in Environment.model_fields.values() for v in names(f)]


def _env_reads(path: Path) -> list[str]:
    """`os.environ.get("HERMES_X")`, `os.getenv("HERMES_X")` and `os.environ["HERMES_X"]` read in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv") and node.args:
            arg = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ" and isinstance(node.ctx, ast.Load):
            arg = node.slice
        else:
            continue
        if isinstance(arg, ast.Constant) and str(arg.value).startswith("HERMES_"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {arg.value}")
    return found


def test_the_product_reads_hermes_variables_only_through_the_model():
    reads = [r for package in ("hermes", "flows", "tasks") for p in sorted((ROOT / package).rglob("*.py"))
             if p.name != "environment.py" for r in _env_reads(p)]
    assert reads == []


def test_the_readme_lists_every_variable_with_its_default():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in readme.splitlines()
            if line.startswith("| `")}
    for name, field in Environment.model_fields.items():
        row = ", ".join(f"`{v}`" for v in names(field))
        assert row in rows, f"README's environment table has no row for {row}"
        if field.default not in (None, "") and field.default_factory is None:
            assert rows[row] == f"`{field.default}`", row


def test_variables_are_read_when_asked_not_when_imported(monkeypatch):
    from hermes.model.client import resolve_api_key
    from hermes.sandbox.base import DEFAULT_IMAGE, SandboxSettings
    from hermes.settings import AgentSettings

    monkeypatch.delenv("HERMES_SANDBOX_IMAGE", raising=False)
    assert SandboxSettings().image == DEFAULT_IMAGE
    monkeypatch.setenv("HERMES_SANDBOX_IMAGE", "mine:1")
    assert SandboxSettings().image == "mine:1"
    monkeypatch.setenv("HERMES_SANDBOX_IMAGE", "")  # empty is unset, as it was
    assert SandboxSettings().image == DEFAULT_IMAGE

    monkeypatch.setenv("HERMES_WEB_ALLOW_HOSTS", " Docs.Internal., 10.0.0.0/8,,")
    assert AgentSettings().web_allow_hosts == ["docs.internal", "10.0.0.0/8"]

    # the key's chain: the first one set, an empty one skipped; none: the placeholder local servers accept
    for name in ("HERMES_API_KEY", "OPENROUTER_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert resolve_api_key() == "no-key"
    monkeypatch.setenv("OPENAI_API_KEY", "k-oa")
    monkeypatch.setenv("HERMES_API_KEY", "")
    assert resolve_api_key() == "k-oa"
    monkeypatch.setenv("OPENROUTER_API_KEY", "k-or")
    assert resolve_api_key() == "k-or"
    monkeypatch.setenv("HERMES_API_KEY", "k-hermes")
    assert resolve_api_key() == "k-hermes" and resolve_api_key("k-flag") == "k-flag"

    monkeypatch.setenv("HERMES_TOOLSET_MODULES", "a.b, c ,")
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "7")
    monkeypatch.delenv("HERMES_PREFECT_SERVER_TIMEOUT", raising=False)
    assert read("toolset_modules") == ["a.b", "c"] and read("prefect_server_timeout") == 7.0
    monkeypatch.setenv("HERMES_PREFECT_SERVER_TIMEOUT", "0.5")
    assert read("prefect_server_timeout") == 0.5


def test_a_bad_value_is_refused_naming_the_variable_and_fails_no_other(monkeypatch):
    monkeypatch.setenv("HERMES_PREFECT_SERVER_TIMEOUT", "soon")
    monkeypatch.setenv("HERMES_PREFECT_SERVER", " Ephemeral ")
    with pytest.raises(EnvironmentInvalid, match=r"^HERMES_PREFECT_SERVER_TIMEOUT='soon': "):
        read("prefect_server_timeout")
    assert read("prefect_server") == "ephemeral"  # another variable still reads
    with pytest.raises(EnvironmentInvalid, match="HERMES_PREFECT_SERVER_TIMEOUT='soon'"):
        environment()  # all at once: the bad one is named
    monkeypatch.setenv("HERMES_PREFECT_SERVER", "sometimes")
    with pytest.raises(ValueError, match=r"^HERMES_PREFECT_SERVER='sometimes': expected background or ephemeral$"):
        read("prefect_server")
    monkeypatch.setenv("HERMES_DASK_ADDRESS", "not an address")
    with pytest.raises(EnvironmentInvalid, match="HERMES_DASK_ADDRESS='not an address': expected a Dask scheduler"):
        read("dask_address")
    with pytest.raises(KeyError):
        read("no_such_variable")


def test_hermes_batch_env_lists_every_variable_and_no_key(tmp_path):
    env = {**os.environ, "OPENAI_API_KEY": "sk-never-shown-0123456789", "HERMES_API_KEY": "",
           "HERMES_VISION_API_KEY": "vision-key-never-shown", "HERMES_ENGINE": "direct", "HERMES_MODEL": ""}
    env.pop("OPENROUTER_API_KEY", None)
    out = subprocess.run([sys.executable, "-m", "flows.cli", "env"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    for variable in VARIABLES:
        assert variable in out
    assert "never-shown" not in out
    blocks = {b.splitlines()[0]: b for b in ("\n" + out).split("\nHERMES_")[1:]}
    assert "now: set (OPENAI_API_KEY)" in blocks["API_KEY | OPENROUTER_API_KEY | OPENAI_API_KEY"]
    assert "now: direct" in blocks["ENGINE"] and "now: unset" in blocks["MODEL"]
    assert "default: anthropic/claude-sonnet-4.6" in blocks["MODEL"]
    listed = subprocess.run([sys.executable, "-m", "flows.cli", "--help"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120, check=True).stdout
    assert "\n  env " in listed


def test_the_model_agrees_with_the_readers_own_choices():
    from flows.run_command import ENGINES
    from hermes.api.server_settings import ApiSettings

    assert set(get_args(Environment.model_fields["engine"].annotation)) == set(ENGINES)
    # the API server reads HERMES_BASE_URL / HERMES_MODEL itself (over its config file): same defaults
    assert ApiSettings.model_fields["upstream_base_url"].default == Environment.model_fields["base_url"].default
    assert ApiSettings.model_fields["upstream_model"].default == Environment.model_fields["model"].default
