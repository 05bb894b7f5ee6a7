"""`hermes-batch demo`: the main job end to end on local defaults.

A local Prefect server (started in the background by the first run, reused later), a DuckDB
file, Docker sandboxes (the default image is built offline when missing) and the bundled
scripted model server on loopback.
"""
from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

from hermes.sandbox import SandboxSettings, backend_names, get_backend

DEMO_DATASET = Path(__file__).resolve().parent.parent / "deployments" / "demo" / "prompts.jsonl"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hermes-batch demo", description=__doc__)
    p.add_argument("--dataset_file", default=str(DEMO_DATASET))
    p.add_argument("--run_name", default=None, help="default: demo-<timestamp>")
    p.add_argument("--num_workers", default="4")
    p.add_argument("--batch_size", default="5")
    p.add_argument("--sandbox_backend", default="docker", choices=backend_names())
    a = p.parse_args(argv)

    from flows.run_command import run_from_args, run_parser
    from mockllm import MockLLM

    image = get_backend(SandboxSettings(backend=a.sandbox_backend)).ensure_default_image()
    if image:  # a backend with images of its own built it if it was missing
        print(f"sandbox image: {image}")
    run_name = a.run_name or datetime.now().strftime("demo-%Y%m%d-%H%M%S")
    with MockLLM() as server:
        print(f"bundled model server: {server.base_url}")
        args = run_parser("hermes-batch demo").parse_args([
            "--dataset_file", a.dataset_file, "--batch_size", a.batch_size, "--run_name", run_name,
            "--base_url", server.base_url, "--model", "hermes-mock", "--api_key", "demo",
            "--num_workers", a.num_workers, "--sandbox_backend", a.sandbox_backend])
        return run_from_args(args)
