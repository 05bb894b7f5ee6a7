"""The product's real default image (Debian with python3, git) end to end: a coding task's tools
are there, as nobody, under the sandbox's hardening, and a row can set up and check a real task."""
from __future__ import annotations

import pytest

from hermes.run import direct
from hermes.sandbox.base import SandboxError, SandboxSettings
from tests.conftest import containers_of
from tests.helpers import script, tool_responses
from tests.run.test_row_setup_checks import DONE, journal, settings, terminal, write

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST = "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n    def test_add(self):\n" \
       "        self.assertEqual(add(2, 3), 5)\n"
GIT = "git -c user.email=t@t -c user.name=t"


def script_of(*turns: dict) -> str:
    return script(*turns, DONE)


def test_a_coding_task_on_the_default_image(tmp_path, mock_llm, default_image, docker_engine):
    probe = terminal("python3 -c 'import sys, ssl; print(\"py\", sys.version_info[0], 6 * 7)'", "git --version",
                     "id -u; pip --version | cut -d' ' -f1; python3 -m venv /tmp/venv && /tmp/venv/bin/python -V")
    rows = [{"prompt": "Probe the tools. " + script_of(probe), "case": "tools"},
            {"prompt": "Fix the bug. " + script_of(write("calc.py", FIXED),
                                                   terminal("python3 -m unittest -q test_calc 2>&1 | tail -1",
                                                            "git status --short")),
             "case": "task", "cwd": "/workspace/repo", "files": {"calc.py": BUGGY, "test_calc.py": TEST},
             "setup": f"git init -q . && git add -A && {GIT} commit -qm init",
             "check": "python3 -m unittest -q test_calc && git diff --stat | grep -q calc.py"}]
    s = settings(tmp_path, rows, "debian", mock_llm.base_url, sandbox=SandboxSettings(image=default_image))
    stats = direct.run(s)
    entries = journal(tmp_path, "debian")
    assert all(e["hermes"]["status"] == "completed" for e in entries.values()), \
        {k: e["hermes"]["error"] for k, e in entries.items()}

    said = [r["content"]["output"].strip() for r in tool_responses(entries["tools"])]
    assert said[0] == "py 3 42"
    assert said[1].startswith("git version 2.")
    assert said[2].splitlines()[0] == "65534" and said[2].splitlines()[1] == "pip"
    assert said[2].splitlines()[2].startswith("Python 3.")

    task = entries["task"]
    ran = [r["content"]["output"].strip() for r in tool_responses(task) if r["name"] == "terminal"]
    assert ran == ["OK", "M calc.py"]
    assert task["reward"]["passed"] is True and task["reward"]["exit_code"] == 0
    assert stats["check_statistics"]["pass_rate"] == 100.0
    assert containers_of(docker_engine, "debian") == []



def test_the_offline_build_takes_the_mirror_apt_uses(tmp_path):
    from hermes.sandbox.debian import apt_mirror

    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://mirror.internal/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\nTypes: deb\nURIs: http://mirror.internal/debian-security\nSuites: bookworm-security\n")
    assert apt_mirror("bookworm", str(tmp_path)) == "http://mirror.internal/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("# deb http://old/debian bookworm main\n"
                                           "deb [arch=amd64 signed-by=/k.gpg] http://one-line/debian bookworm main\n")
    assert apt_mirror("bookworm", str(tmp_path)) == "http://one-line/debian"
    with pytest.raises(SandboxError, match="no Debian mirror for trixie"):
        apt_mirror("trixie", str(tmp_path))
