"""The installed `hermes-batch` console script and the bundled stand-in servers, run as a user runs
them: each server started as a command on a free loopback port, asked over HTTP what a client asks
it, and stopped with SIGTERM (what Ctrl-C or a service manager sends); `--help` and `env` read as
text. tests/flows/test_batch_task_runs.py runs the script's `run` and `server`; everything else in
the suite goes through `python -m flows.cli`, which is not what `pip install` puts on the PATH.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port, script, until

ROOT = Path(__file__).resolve().parents[2]


def hermes_batch() -> str:
    exe = shutil.which("hermes-batch")
    assert exe, "the hermes-batch command is not installed (pip install -e .)"
    return exe


class Served:
    """A server command in its own process, its output collected line by line as it comes."""

    def __init__(self, argv: list[str], tmp: Path):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(argv, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={k: v for k, v in os.environ.items() if not k.startswith("HERMES_")})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def says(self, pattern: str) -> re.Match:
        """The first line matching pattern, once the command has printed it."""
        def found():
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n" + "\n".join(self.lines)
            return next((m for line in self.lines if (m := re.search(pattern, line))), None)
        return until(found, f"the command to print {pattern!r}", timeout=60)

    def stop(self) -> int:
        """SIGTERM, as a user's Ctrl-C or a service manager ends it; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(5)


def test_hermes_batch_mock_llm_serves_a_chat_completion_on_the_port_it_is_given(tmp_path):
    port = free_port()
    served = Served([hermes_batch(), "mock-llm", "--port", str(port)], tmp_path)
    try:
        base_url = served.says(r"mock-llm listening on (http://\S+)").group(1)
        assert base_url == f"http://127.0.0.1:{port}/v1"
        # What an OpenAI client sends; the scripted prompt fixes what the model answers.
        answer = httpx.post(f"{base_url}/chat/completions", timeout=30, headers={"Authorization": "Bearer any"}, json={
            "model": "mock-model",
            "messages": [{"role": "user", "content": script({"reasoning": "r", "content": "hello from the console"})}]})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["object"] == "chat.completion"
        [choice] = body["choices"]
        assert choice["message"]["role"] == "assistant" and choice["message"]["content"] == "hello from the console"
        assert choice["finish_reason"] == "stop"
    finally:
        status = served.stop()
    assert status == 0, "\n".join(served.lines)
    with pytest.raises(httpx.ConnectError):  # stopped means the port is closed, not just the process gone
        httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)


def test_the_bundled_searxng_stand_in_answers_a_json_search_on_the_port_it_is_given(tmp_path):
    port = free_port()
    served = Served([sys.executable, "-m", "mockllm.searxng", "--port", str(port)], tmp_path)
    try:
        url = served.says(r"SearXNG-compatible test server on (http://\S+) \((\d+) pages\)").group(1)
        assert url.rstrip("/") == f"http://127.0.0.1:{port}"
        found = httpx.get(f"http://127.0.0.1:{port}/search", params={"q": "fennec fox ears", "format": "json"},
                          timeout=30)
        assert found.status_code == 200 and found.headers["content-type"].startswith("application/json")
        body = found.json()
        assert body["query"] == "fennec fox ears" and body["number_of_results"] == len(body["results"]) > 0
        best = body["results"][0]
        assert best["title"] == "The fennec fox" and best["url"] == f"http://127.0.0.1:{port}/pages/fennec-fox.html"
        page = httpx.get(best["url"], timeout=30)  # the result links to a page the same server serves
        assert page.status_code == 200 and "fennec fox" in page.text
    finally:
        status = served.stop()
    assert status == 0, "\n".join(served.lines)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/search?q=x&format=json", timeout=5)


def test_hermes_batch_help_lists_its_commands(tmp_path):
    done = subprocess.run([hermes_batch(), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: hermes-batch COMMAND [options]")
    listed = re.findall(r"^  (\S+)\s{2,}\S", done.stdout, re.M)
    for command in ("run", "merge", "list-distributions", "mock-llm", "sandbox", "demo", "server", "status",
                    "chat", "serve", "tasks", "verify", "view", "export", "publish", "env"):
        assert command in listed, (command, done.stdout)
    unknown = subprocess.run([hermes_batch(), "no-such-command"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
    assert unknown.returncode == 2 and "commands:" in unknown.stdout  # a typo is told the commands, not run


def test_hermes_batch_env_lists_the_hermes_variables_and_never_a_key(tmp_path):
    keys = ("HERMES_", "OPENROUTER_API_KEY", "OPENAI_API_KEY")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(keys)}, "HERMES_API_KEY": "sk-never-shown"}
    done = subprocess.run([hermes_batch(), "env"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # one block a variable: its name(s), then its value now, its default and what it means
    blocks = {m.group(1): m.group(2) for m in re.finditer(r"^(HERMES_[A-Z0-9_]+)[^\n]*\n((?:    [^\n]*\n?)+)",
                                                           done.stdout, re.M)}
    assert {"HERMES_API_KEY", "HERMES_BASE_URL", "HERMES_MODEL", "HERMES_ENGINE"} <= set(blocks), done.stdout
    assert all("    now: " in b and "    default: " in b for b in blocks.values()), done.stdout
    assert blocks["HERMES_API_KEY"].startswith("    now: set (HERMES_API_KEY)\n")
    assert "sk-never-shown" not in done.stdout  # a key is "set", never shown
    assert blocks["HERMES_ENGINE"].startswith("    now: unset\n    default: prefect\n")
    help_ = subprocess.run([hermes_batch(), "env", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert help_.returncode == 0 and help_.stdout.startswith("usage: hermes-batch env")
