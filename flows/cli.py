"""The `hermes-batch` command and the reference-compatible `batch_runner.py` flags.

Prefect is configured for offline, local use before it is first imported; without PREFECT_API_URL
a run uses the local background server of flows/local_server.py.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

# Prefect reads these when first imported: set them before any flow is.
_PREFECT_DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "200",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
    "PREFECT_LOGGING_EXTRA_LOGGERS": "hermes",
    # hermes logs outside flow runs too (tests, chat, the API server): not an error.
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
}


def configure_prefect() -> None:
    for k, v in _PREFECT_DEFAULTS.items():
        os.environ.setdefault(k, v)


configure_prefect()

from pydantic import ValidationError  # noqa: E402

from hermes import distributions  # noqa: E402
from hermes.dataset import DatasetError  # noqa: E402
from hermes.distributions import DistributionError  # noqa: E402
from hermes.rundir import RunRefused  # noqa: E402
from hermes.sandbox.base import SandboxSettings  # noqa: E402
from hermes.settings import RunSettings  # noqa: E402

ENGINES = ("prefect", "direct")
USER_ERRORS = (DatasetError, DistributionError, RunRefused, ValueError, FileNotFoundError)


def _bool(text: str) -> bool:
    t = str(text).strip().lower()
    if t in ("1", "true", "yes", "y", "on"):
        return True
    if t in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _add_model_flags(p: argparse.ArgumentParser, model: type, prefix: str = "", skip: Sequence[str] = ()) -> None:
    """One flag per settings field, so the command line and the Prefect form never drift apart."""
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        flag = f"--{prefix}{name}"
        help_ = field.description or ""
        if field.annotation is bool:
            # --resume, --resume=true and --resume false all work, as with the reference's fire CLI.
            p.add_argument(flag, nargs="?", const=True, default=None, type=_bool, help=help_)
        else:
            p.add_argument(flag, default=None, help=help_)


def _add_toolset_flags(p: argparse.ArgumentParser) -> None:
    """--<toolset>_<field> for every registered toolset's settings (e.g. --web_allow_hosts)."""
    from hermes.tools import toolsets

    for ts in toolsets().values():
        if ts.settings is not None:
            _add_model_flags(p, ts.settings, prefix=f"{ts.prefix}_")


def _toolset_values(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from hermes.tools import toolsets

    given = vars(args)
    return {ts.name: {name: given[f"{ts.prefix}_{name}"] for name in ts.settings.model_fields
                      if given.get(f"{ts.prefix}_{name}") is not None}
            for ts in toolsets().values() if ts.settings is not None}


def describe_distributions(args: argparse.Namespace) -> str:
    """The distributions table, saying which toolsets are available with these settings."""
    from hermes.settings import ToolsetSettings
    from hermes.tools import availability, env_secret

    return distributions.describe(availability(ToolsetSettings(**_toolset_values(args)), env_secret))


def run_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Run a tool-using agent over every prompt of a JSONL dataset.")
    _add_model_flags(p, RunSettings, skip=("sandbox", "tools"))
    _add_model_flags(p, SandboxSettings, prefix="sandbox_")
    _add_toolset_flags(p)
    p.add_argument("--api_key", default=None, help="API key (else HERMES_API_KEY, OPENROUTER_API_KEY or OPENAI_API_KEY)")
    p.add_argument("--list_distributions", action="store_true", help="print the toolset distributions and exit")
    p.add_argument("--engine", choices=ENGINES, default=os.environ.get("HERMES_ENGINE") or "prefect",
                   help="prefect (default; env HERMES_ENGINE): a Prefect flow run, on the server PREFECT_API_URL "
                        "names, else on a local Prefect server kept in the background (started by the first run, "
                        "reused by later ones; `hermes-batch server stop` ends it), or with "
                        "HERMES_PREFECT_SERVER=ephemeral on Prefect's embedded server booted for this run "
                        "(seconds); direct: the same run without Prefect (no server, no flow-run records or "
                        "artifacts; same outputs and resume)")
    return p


def settings_from_args(args: argparse.Namespace) -> RunSettings:
    values: dict[str, Any] = {}
    sandbox: dict[str, Any] = {}
    for k, v in vars(args).items():
        if v is None or k in ("api_key", "list_distributions", "command", "engine"):
            continue
        if k.startswith("sandbox_"):
            sandbox[k.removeprefix("sandbox_")] = v
        elif k in RunSettings.model_fields:
            values[k] = v
    values["sandbox"] = SandboxSettings(**sandbox)
    values["tools"] = _toolset_values(args)
    return RunSettings(**values)


def _setup_logging(verbose: bool, engine: str) -> None:
    logger = logging.getLogger("hermes")
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    if engine == "direct":
        # Under Prefect its console handler prints our logs (PREFECT_LOGGING_EXTRA_LOGGERS=hermes).
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d | %(levelname)-7s | %(name)s - %(message)s",
                                               "%H:%M:%S"))
        logger.addHandler(handler)


def run_from_args(args: argparse.Namespace) -> int:
    if args.list_distributions:
        print(describe_distributions(args))
        return 0
    try:
        settings = settings_from_args(args)
    except ValidationError as e:
        print(f"error: {_validation_text(e)}", file=sys.stderr)
        return 2
    if args.api_key:
        os.environ["HERMES_API_KEY"] = args.api_key  # kept out of flow parameters, which Prefect stores
    _setup_logging(settings.verbose, args.engine)
    from hermes.outcome import TooManyFailedPrompts
    from hermes.stats import format_table

    _exit_promptly_on_interrupt()
    try:
        if args.engine == "direct":
            from hermes import direct  # imports no Prefect: nothing of it to load or boot

            stats = direct.run(settings)
        else:
            from flows.local_server import for_this_run

            # for_this_run before Prefect is imported: it reads PREFECT_API_URL once
            with for_this_run(), _heartbeats_only_if_asked():
                from flows.batch import batch_run

                stats = batch_run(settings=settings)
    except TooManyFailedPrompts as e:
        print(format_table(e.stats))
        print(f"error: {e}", file=sys.stderr)
        return 1
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(stats))
    out = os.path.join(settings.output_dir, settings.run_name)
    print(f"\ntrajectories: {os.path.join(out, 'trajectories.jsonl')}\nstatistics:   {os.path.join(out, 'statistics.json')}")
    return 0


@contextlib.contextmanager
def _heartbeats_only_if_asked() -> Iterator[None]:
    """A command-line flow run sends no heartbeats unless PREFECT_FLOWS_HEARTBEAT_FREQUENCY asks.

    Prefect's default sends one every 180 s from a thread that sleeps in steps of a second, and
    the run's end waits for it to notice: half a second of every run, measured. Heartbeats are
    for the zombie-run automation (deployments/prefect/automations.yaml), which needs one every
    30 s, as the deployments' workers send (prefect.yaml); 180 s could not satisfy it anyway.
    """
    if os.environ.get("PREFECT_FLOWS_HEARTBEAT_FREQUENCY"):
        yield
        return
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def _exit_promptly_on_interrupt() -> None:
    """Ctrl-C or SIGTERM ends a command-line run at once.

    Every finished prompt is already synced to its batch file and the run's containers are
    removed by the run's own handler (which runs first and then calls this one), so nothing is
    lost by exiting now; waiting instead means minutes of Prefect retrying calls to its ephemeral
    server, which the same Ctrl-C has stopped. The background server (flows/local_server.py) is
    no SubprocessASGIServer and runs in a session of its own: it is shared, and it stays.
    """
    import signal

    def handler(signum, frame):
        sys.stderr.write("\ninterrupted: every finished prompt is saved; continue with --resume\n")
        if "prefect" in sys.modules:  # --engine direct never loads it
            try:
                from prefect.server.api.server import SubprocessASGIServer

                for server in list(SubprocessASGIServer._instances.values()):
                    server.stop()
            except Exception:
                pass
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _validation_text(e: ValidationError) -> str:
    return "; ".join(f"--{'_'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())


def status_main(argv: Sequence[str]) -> int:
    from hermes.status import format_status, run_status

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
    from hermes import single_run as chat
    from hermes.settings import AgentSettings

    p = argparse.ArgumentParser(prog="hermes-batch chat", description="Run the agent once on one prompt.")
    p.add_argument("prompt")
    _add_model_flags(p, AgentSettings, skip=("sandbox", "tools"))
    _add_model_flags(p, SandboxSettings, prefix="sandbox_")
    _add_toolset_flags(p)
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
        settings = AgentSettings(**values, sandbox=SandboxSettings(**sandbox), tools=_toolset_values(a))
    except (ValidationError, ValueError, FileNotFoundError) as e:
        print(f"error: {_validation_text(e) if isinstance(e, ValidationError) else e}", file=sys.stderr)
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
        _add_toolset_flags(p)
        print(describe_distributions(p.parse_args(rest)))
        return 0
    if command == "merge":
        p = argparse.ArgumentParser(prog="hermes-batch merge")
        p.add_argument("run_name")
        p.add_argument("--output_dir", default="data")
        a = p.parse_args(rest)
        from flows.merge import merge
        from hermes.stats import format_table
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
    if command == "serve":
        from flows.serve import main as serve_main
        return serve_main(rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
