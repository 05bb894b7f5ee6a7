"""llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) over a GGUF model, on loopback.

Two ways to serve a tool-calling model, as users do:

- template: the model's own chat template from the GGUF (tools are written into the prompt;
  the model answers with tool calls as text, which the server passes on as content);
- grammar:  `--chat_format chatml-function-calling` (llama-cpp-python's grammar-constrained
  function calling: native `tool_calls` when the model chooses to call).

The server lives in its own virtual environment (it builds llama.cpp from source: 10-15 min on
2 cores), not in the project's:

    python3 -m venv /work/models/venv
    CMAKE_ARGS="-DGGML_CUDA=OFF -DGGML_BLAS=OFF" /work/models/venv/bin/pip install "llama-cpp-python[server]==0.3.36"

    python -m bench.real_model_serve --mode template --port 8090     # serves until Ctrl-C

llama-cpp-python's server reads its settings from the environment too (pydantic-settings with
no prefix: MODEL, CHAT_FORMAT, HOST, PORT, N_CTX, API_KEY...), so it starts with a scrubbed
environment: only what a process needs to run, never the caller's variables.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

DEFAULT_PYTHON = Path("/work/models/venv/bin/python")
DEFAULT_MODEL = Path("/work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
#: mode -> the server's extra flags
MODES = {
    "template": [],
    "grammar": ["--chat_format", "chatml-function-calling"],
}
#: the only variables the server sees: none of them is one of its settings
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "TMPDIR")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrubbed_env(threads: int) -> dict[str, str]:
    env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
    env["HOME"] = "/nonexistent"
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def command(python: Path, model: Path, mode: str, port: int, n_ctx: int, threads: int, alias: str) -> list[str]:
    return [str(python), "-m", "llama_cpp.server", "--model", str(model), "--model_alias", alias,
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
            "--n_threads", str(threads), "--n_threads_batch", str(threads), *MODES[mode]]


def wait_ready(base_url: str, proc: subprocess.Popen, log: Path, limit: float = 300.0) -> None:
    """Until GET /v1/models answers (loading a 1 GB model takes seconds; the first start maps it)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama.cpp server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=5) as r:
                json.load(r)
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.5)
    raise RuntimeError(f"llama.cpp server not ready in {limit:.0f} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def serve(mode: str = "template", *, model: Path = DEFAULT_MODEL, python: Path = DEFAULT_PYTHON,
          port: int | None = None, n_ctx: int = 8192, threads: int = 2, alias: str = "qwen2.5-coder-1.5b",
          log: Path | None = None) -> Iterator[str]:
    """Start the server, yield its base URL (http://127.0.0.1:PORT/v1), stop it on exit.
    Its output (llama.cpp's per-request timings among it) goes to `log`."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {sorted(MODES)}, not {mode!r}")
    for path, what in ((python, "the server's Python (see this module's doc)"), (model, "the model (bench.real_model_fetch)")):
        if not path.exists():
            raise FileNotFoundError(f"{path}: {what} is missing")
    port = port or free_port()
    log = log or Path(f"/tmp/llama-server-{port}.log")
    base_url = f"http://127.0.0.1:{port}/v1"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(command(python, model, mode, port, n_ctx, threads, alias), stdout=sink,
                                stderr=subprocess.STDOUT, env=scrubbed_env(threads), start_new_session=True)
    try:
        wait_ready(base_url, proc, log)
        yield base_url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.real_model_serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=sorted(MODES), default="template")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--python", type=Path, default=DEFAULT_PYTHON, help="the venv with llama-cpp-python[server]")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--n_ctx", type=int, default=8192)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--log", type=Path, default=None)
    a = p.parse_args(argv)
    # SIGTERM ends it like Ctrl-C, so the server below is stopped too (not left orphaned)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with serve(a.mode, model=a.model, python=a.python, port=a.port, n_ctx=a.n_ctx, threads=a.threads,
               log=a.log) as base_url:
        print(base_url, flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
