"""A single agent run outside batches, as the reference CLI does it.

With trajectories on (`--save-trajectories`, or `agent.save_trajectories: true` in the config
file), the conversation is appended to trajectory_samples.jsonl when it completed, else to
failed_trajectories.jsonl, in the working directory: {"conversations","timestamp","model","completed"}.
"""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from hermes.data import journal
from hermes.environment import read
from hermes.agent.loop import AgentRun, compose_system_prompt
from hermes.agent.conversation import converse, tool_context
from hermes.model.client import ModelClient
from hermes.agent.prefill import load_prefill
from hermes.sandbox import SandboxSpec, get_backend
from hermes.settings import AgentSettings
from hermes.tools import SharedResources, env_secret, openai_schemas, tools_for, usable_toolsets
from hermes.data.trajectory import to_sharegpt

SAMPLES_FILE = "trajectory_samples.jsonl"
FAILED_FILE = "failed_trajectories.jsonl"


def default_config_path() -> Path:
    return read("home") / "config.yaml"


def load_config(path: Path | None) -> dict[str, Any]:
    """The reference's config.yaml; a missing default file is no error, a named one is."""
    explicit = path is not None
    path = path or default_config_path()
    if not path.exists():
        if explicit:
            raise FileNotFoundError(f"config file {path} does not exist")
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"config file {path}: not valid YAML ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"config file {path}: expected a mapping at the top level")
    return data


def save_trajectories_enabled(config: dict[str, Any]) -> bool:
    agent = config.get("agent") or {}
    return bool(isinstance(agent, dict) and agent.get("save_trajectories", False))


def chat(prompt: str, settings: AgentSettings, toolsets: list[str], *, image: str | None = None,
         cwd: str | None = None) -> tuple[AgentRun, list[dict[str, Any]]]:
    offered = tools_for(usable_toolsets(settings.tools, env_secret, toolsets))
    spec = SandboxSpec(image=image or settings.sandbox.image, cwd=cwd,
                       labels={"hermes-batch.run": "chat", "hermes-batch.prompt": "0"})
    client = ModelClient(settings)
    shared = SharedResources()
    try:
        context = tool_context(settings, api_key=client.api_key, shared=shared)
        run = converse(client, prompt, offered, spec, get_backend(settings.sandbox), context=context,
                       max_turns=settings.max_turns,
                       system_prompt=compose_system_prompt(settings.ephemeral_system_prompt),
                       prefill=load_prefill(settings.prefill_messages_file)).run
    finally:
        shared.close()
        client.close()
    return run, openai_schemas(offered)


def save_trajectory(run: AgentRun, tools: list[dict[str, Any]], model: str, directory: Path = Path(".")) -> Path:
    completed = run.completed and not run.error
    path = directory / (SAMPLES_FILE if completed else FAILED_FILE)
    journal.append(path, {"conversations": to_sharegpt(run.messages, tools),
                          "timestamp": datetime.now().isoformat(), "model": model, "completed": completed})
    return path
