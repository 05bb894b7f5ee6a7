"""`hermes-batch run` and `batch_runner.py`: the reference's flags, their settings, one run.

Every settings field is a flag, so the command line and the Prefect form never drift apart.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import Any, Iterator, Sequence

from flows.prefect_env import configure_prefect

configure_prefect()

from pydantic import ValidationError  # noqa: E402

from hermes.data import distributions  # noqa: E402
from hermes.data.dataset import DatasetError  # noqa: E402
from hermes.data.distributions import DistributionError  # noqa: E402
from hermes.environment import EnvironmentInvalid, read  # noqa: E402
from hermes.run.prompt_log import quiet_prompts_on  # noqa: E402
from hermes.run.rundir import RunRefused  # noqa: E402
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


def add_model_flags(p: argparse.ArgumentParser, model: type, prefix: str = "", skip: Sequence[str] = ()) -> None:
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


def add_toolset_flags(p: argparse.ArgumentParser) -> None:
    """--<toolset>_<field> for every registered toolset's settings (e.g. --web_allow_hosts)."""
    from hermes.tools import toolsets

    for ts in toolsets().values():
        if ts.settings is not None:
            add_model_flags(p, ts.settings, prefix=f"{ts.prefix}_")


def toolset_values(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from hermes.tools import toolsets

    given = vars(args)
    return {ts.name: {name: given[f"{ts.prefix}_{name}"] for name in ts.settings.model_fields
                      if given.get(f"{ts.prefix}_{name}") is not None}
            for ts in toolsets().values() if ts.settings is not None}


def describe_distributions(args: argparse.Namespace) -> str:
    """The distributions table, saying which toolsets are available with these settings."""
    from hermes.settings import ToolsetSettings
    from hermes.tools import availability, env_secret

    return distributions.describe(availability(ToolsetSettings(**toolset_values(args)), env_secret))


def run_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Run a tool-using agent over every prompt of a JSONL dataset.")
    add_model_flags(p, RunSettings, skip=("sandbox", "tools"))
    add_model_flags(p, SandboxSettings, prefix="sandbox_")
    add_toolset_flags(p)
    p.add_argument("--api_key", default=None, help="API key (else HERMES_API_KEY, OPENROUTER_API_KEY or OPENAI_API_KEY)")
    p.add_argument("--list_distributions", action="store_true", help="print the toolset distributions and exit")
    try:
        engine = read("engine")  # HERMES_ENGINE
    except EnvironmentInvalid as e:
        p.error(str(e))
    p.add_argument("--engine", choices=ENGINES, default=engine,
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
    values["sandbox"] = sandbox  # validated with the rest: an error names its flag, --sandbox_...
    values["tools"] = toolset_values(args)
    return RunSettings(**values)


def _setup_logging(verbose: bool, engine: str) -> None:
    logger = logging.getLogger("hermes")
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    if engine == "direct":
        # Under Prefect its console handler prints our logs (PREFECT_LOGGING_EXTRA_LOGGERS=hermes).
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d | %(levelname)-7s | %(name)s - %(message)s",
                                               "%H:%M:%S"))
        if not verbose:
            quiet_prompts_on([handler])
        logger.addHandler(handler)


def run_from_args(args: argparse.Namespace) -> int:
    if args.list_distributions:
        print(describe_distributions(args))
        return 0
    try:
        settings = settings_from_args(args)
    except ValidationError as e:
        print(f"error: {validation_text(e)}", file=sys.stderr)
        return 2
    if args.api_key:
        os.environ["HERMES_API_KEY"] = args.api_key  # kept out of flow parameters, which Prefect stores
    _setup_logging(settings.verbose, args.engine)
    from hermes.data.outcome import TooManyFailedPrompts
    from hermes.run.summary import format_summary

    _exit_promptly_on_interrupt()
    try:
        if args.engine == "direct":
            from hermes.run import direct  # imports no Prefect: nothing of it to load or boot

            stats = direct.run(settings)
        else:
            from flows.local_server import for_this_run

            # for_this_run before Prefect is imported: it reads PREFECT_API_URL once
            with for_this_run(), _heartbeats_only_if_asked():
                from flows.batch import batch_run

                stats = batch_run(settings=settings)
    except TooManyFailedPrompts as e:
        print(format_summary(e.stats, settings.output_dir))
        print(f"error: {e}", file=sys.stderr)
        return 1
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_summary(stats, settings.output_dir))  # statistics.json holds the whole table (format_table)
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


def validation_text(e: ValidationError) -> str:
    return "; ".join(f"{flag_of(err['loc'])}: {err['msg']}" for err in e.errors())


def flag_of(loc: tuple) -> str:
    """The flag a user typed for a settings field: ("sandbox", "memory") is --sandbox_memory, a
    toolset's ("tools", "web", "search_backend") is --web_search_backend (its toolset's prefix)."""
    from hermes.tools import toolsets

    parts = [str(x) for x in loc]
    if parts[0] == "tools" and len(parts) > 2 and parts[1] in toolsets():
        parts = [toolsets()[parts[1]].prefix, *parts[2:]]
    return "--" + "_".join(parts)
