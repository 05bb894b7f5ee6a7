"""The `hermes-batch` command and the reference-compatible `batch_runner.py` flags.

Prefect is configured for offline, local use before it is first imported; without PREFECT_API_URL
a run uses the local background server of flows/local_server.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from flows.prefect_env import configure_prefect

configure_prefect()

from pydantic import ValidationError  # noqa: E402

from flows.run_command import (  # noqa: E402
    add_model_flags,
    add_toolset_flags,
    toolset_values,
    validation_text,
    describe_distributions,
    run_from_args,
    run_parser,
)
from hermes.sandbox.base import SandboxSettings  # noqa: E402

__all__ = ["configure_prefect", "main", "run_from_args", "run_parser"]


def status_main(argv: Sequence[str]) -> int:
    from hermes.run.status import format_status, run_status

    p = argparse.ArgumentParser(prog="hermes-batch status")
    p.add_argument("run_name")
    p.add_argument("--output_dir", default="data")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    a = p.parse_args(argv)
    try:
        s = run_status(Path(a.output_dir) / a.run_name)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(s, indent=2) if a.json else format_status(s))
    return 0


def chat_main(argv: Sequence[str]) -> int:
    from hermes.agent import single_run as chat
    from hermes.settings import AgentSettings

    p = argparse.ArgumentParser(prog="hermes-batch chat", description="Run the agent once on one prompt.")
    p.add_argument("prompt")
    add_model_flags(p, AgentSettings, skip=("sandbox", "tools"))
    add_model_flags(p, SandboxSettings, prefix="sandbox_")
    add_toolset_flags(p)
    p.add_argument("--api_key", default=None)
    p.add_argument("--toolsets", default="terminal,file", help="comma list of toolsets to offer")
    p.add_argument("--image", default=None, help="sandbox image (default: the sandbox setting)")
    p.add_argument("--cwd", default=None, help="working directory inside the sandbox")
    p.add_argument("--config", default=None, help="config file (default: $HERMES_HOME/config.yaml or ~/.hermes/config.yaml)")
    p.add_argument("--save-trajectories", "--save_trajectories", dest="save_trajectories", action="store_true",
                   default=None, help="append the conversation to trajectory_samples.jsonl / failed_trajectories.jsonl")
    a = p.parse_args(argv)
    try:
        config = chat.load_config(Path(a.config) if a.config else None)
        values = {k: v for k, v in vars(a).items() if v is not None and k in AgentSettings.model_fields}
        sandbox = {k.removeprefix("sandbox_"): v for k, v in vars(a).items() if k.startswith("sandbox_") and v is not None}
        settings = AgentSettings(**values, sandbox=SandboxSettings(**sandbox), tools=toolset_values(a))
    except (ValidationError, ValueError, FileNotFoundError) as e:
        print(f"error: {validation_text(e) if isinstance(e, ValidationError) else e}", file=sys.stderr)
        return 2
    if a.api_key:
        os.environ["HERMES_API_KEY"] = a.api_key
    save = a.save_trajectories if a.save_trajectories is not None else chat.save_trajectories_enabled(config)
    toolsets = [t.strip() for t in a.toolsets.split(",") if t.strip()]
    run, tools = chat.chat(a.prompt, settings, toolsets, image=a.image, cwd=a.cwd)
    final = next((m.get("content") for m in reversed(run.messages) if m["role"] == "assistant"), None)
    if run.error:
        print(f"error: {run.error}", file=sys.stderr)
    elif final:
        print(final)
    if save:
        print(f"trajectory saved to {chat.save_trajectory(run, tools, settings.model)}", file=sys.stderr)
    return 0 if run.completed and not run.error else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "run": "run a batch (the reference batch_runner.py flags)",
        "merge": "rebuild trajectories.jsonl and statistics.json of a run from its batch files",
        "list-distributions": "print the toolset distributions",
        "mock-llm": "serve the bundled scripted OpenAI-compatible model on loopback",
        "sandbox": "build the default sandbox image, or remove leftover containers",
        "demo": "the whole job end to end on local defaults (bundled model server, Docker sandboxes)",
        "server": "start, show or stop the local Prefect server that runs use without PREFECT_API_URL",
        "status": "what a run has done, failed and still owes",
        "chat": "one agent run on one prompt, outside batches",
        "serve": "the OpenAI-compatible API server over the agent (127.0.0.1:8642)",
        "tasks": "Harbor task folders: `tasks list PATH` shows each task's needs and problems",
        "verify": "run the task folders' reference solutions and tests (the oracle); name those that fail",
        "view": "look at a run in the browser: summary, entries under filters, conversations, tasks' attempts side by side; two runs compared (127.0.0.1)",
        "export": "a run's trajectories for training: OpenAI messages with tool_calls, ShareGPT, Parquet, or RL (per-turn tokens and logprobs)",
        "publish": "publish a run's final entries as Parquet shards to a folder, s3:// or hf:// (as --publish does live)",
        "env": "the HERMES_* environment variables: each one's value now (keys: set or not), default and meaning",
    }
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print("usage: hermes-batch COMMAND [options]\n\ncommands:")
        for name, text in commands.items():
            print(f"  {name:<20}{text}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        return run_from_args(run_parser("hermes-batch run").parse_args(rest))
    if command == "list-distributions":
        p = argparse.ArgumentParser(prog="hermes-batch list-distributions",
                                    description="The toolset distributions, and which toolsets can run here.")
        add_toolset_flags(p)
        print(describe_distributions(p.parse_args(rest)))
        return 0
    if command == "merge":
        p = argparse.ArgumentParser(prog="hermes-batch merge")
        p.add_argument("run_name")
        p.add_argument("--output_dir", default="data")
        a = p.parse_args(rest)
        from flows.merge import merge
        from hermes.data.stats import format_table
        try:
            print(format_table(merge(a.run_name, a.output_dir)))
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    if command == "mock-llm":
        from mockllm import main as mock_main
        return mock_main(rest) or 0
    if command == "sandbox":
        from hermes.sandbox.image import main as sandbox_main
        if rest[:1] == ["cleanup"] and "--dry-run" not in rest and "-h" not in rest and "--help" not in rest:
            # jobs of dead runs first (hermes/run/clusters.py): their workers' containers then have dead owners
            from hermes.run.clusters import sweep_all
            for name, n in sweep_all().items():
                if n:
                    print(f"cancelled {n} {name} job(s) of dead runs")
        return sandbox_main(rest) or 0
    if command == "status":
        return status_main(rest)
    if command == "chat":
        return chat_main(rest)
    if command == "demo":
        from flows.demo import main as demo_main
        return demo_main(rest)
    if command == "server":
        from flows.local_server import main as server_main
        return server_main(rest)
    if command in ("tasks", "verify"):
        from flows import task_commands
        return (task_commands.tasks_main if command == "tasks" else task_commands.verify_main)(rest)
    if command == "serve":
        from flows.serve import main as serve_main
        return serve_main(rest)
    if command == "view":
        from hermes.view.server import main as view_main
        return view_main(rest)
    if command == "export":
        from hermes.run.export import main as export_main
        return export_main(rest)
    if command == "publish":
        from hermes.run.publish_command import main as publish_main
        return publish_main(rest)
    if command == "env":
        from hermes.environment import listing
        argparse.ArgumentParser(prog="hermes-batch env", description=commands["env"]).parse_args(rest)
        print(listing())
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
