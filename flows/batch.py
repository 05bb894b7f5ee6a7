"""The batch-run flow: the whole life of a run is hermes.run.orchestration.run, carried out by Prefect.

open (refuse/resume, lock, validate) -> plan what is owed -> fan batches out (prompts in flight
bounded by --num_workers) -> record each batch as it lands -> merge -> report -> fail the run if
too many prompts failed. tasks/steps.py says how Prefect carries out each step; if Prefect's API
goes away mid-run, the run finishes without it (tasks/link.py).
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.task_runners import TaskRunner

from hermes.run import local_processes, orchestration
from hermes.run import rundir
from hermes.run.prompt_log import quiet_prompts_on
from hermes.settings import RunSettings
from tasks.link import PrefectLink
from tasks.progress import started_in_this_flow_run
from tasks.run import api_key_from_secret, load_tool_secrets
from tasks.report import TooManyFailedPrompts, check_failed_share  # noqa: F401  (re-exported)
from tasks.steps import PrefectSteps


def task_runner(settings: RunSettings) -> TaskRunner:
    """What carries batch tasks out of the flow's process (only asked when they leave it: in
    this process a batch is a coroutine on the run's loop, tasks/steps.py). With a Dask
    address: that cluster's workers (prefect-dask), as many batches at once as the cluster has
    worker threads; num_workers then bounds the prompts in flight in each worker process
    (hermes/run/remote.py). With worker_processes > 1: worker processes of this machine sharing
    num_workers (hermes/run/local_processes.py)."""
    from prefect_dask import DaskTaskRunner

    if settings.dask_address:
        return DaskTaskRunner(address=settings.dask_address)
    return DaskTaskRunner(cluster_class="distributed.LocalCluster",
                          cluster_kwargs=local_processes.cluster_kwargs(settings))


def _stamp() -> str:
    """The run's scheduled start (UTC, to the second), for one run folder per scheduled run."""
    when = flow_run.scheduled_start_time or datetime.now(timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")


def _stamped(stamp_run_name: bool | None) -> bool:
    # Unset: stamp the runs a schedule made, so each gets its own folder (a fixed run_name would
    # be refused from the second run on for already having results).
    return stamp_run_name if stamp_run_name is not None else "auto-scheduled" in (flow_run.tags or [])


def _run_name(settings: RunSettings | dict, stamp_run_name: bool | None) -> str:
    name = settings.run_name if isinstance(settings, RunSettings) else (settings or {}).get("run_name", "run")
    return f"{name}-{_stamp()}" if _stamped(stamp_run_name) else str(name)


def _flow_run_name() -> str:
    # Deployment runs may hand the parameters over as plain dicts, direct calls as models.
    params = flow_run.parameters
    return "batch-" + _run_name(params.get("settings"), params.get("stamp_run_name"))


def _this_runs_settings(settings: RunSettings, stamp_run_name: bool | None) -> RunSettings:
    if _stamped(stamp_run_name):
        settings = settings.model_copy(update={"run_name": _run_name(settings, True)})
    if not settings.resume and started_in_this_flow_run(settings.run_name):
        # "Retry" in the UI: continue this flow run's own run (failed prompts run again), do not refuse it.
        get_run_logger().info("retry of flow run that already ran '%s': resuming it", settings.run_name)
        settings = settings.model_copy(update={"resume": True})
    return settings


@flow(name="batch-run", flow_run_name=_flow_run_name)
def batch_run(settings: RunSettings, stamp_run_name: bool | None = None, api_key_secret: str | None = None,
              tool_secrets: dict[str, str] | None = None) -> dict:
    """Run a tool-using agent over every prompt of a JSONL dataset, each prompt in its own Docker sandbox.

    Writes trajectories.jsonl and statistics.json into output_dir/run_name; resumable by prompt content.

    Args:
        settings: the run's settings (the batch_runner.py flags)
        stamp_run_name: append the run's scheduled start time (UTC) to run_name, so that each
            run gets its own output folder; unset: only runs started by a schedule are stamped
        api_key_secret: name of a Prefect Secret block holding the model API key; unset: the
            worker's HERMES_API_KEY, OPENROUTER_API_KEY or OPENAI_API_KEY
        tool_secrets: toolsets' keys from Prefect Secret blocks, as environment variable -> block
            name (e.g. {"TAVILY_API_KEY": "tavily-key"}); unset ones come from the worker's environment
    """
    load_tool_secrets(tool_secrets)
    settings = _this_runs_settings(settings, stamp_run_name)
    if not settings.verbose:  # each prompt's start and end: in its batch's logs, not on the terminal
        from prefect.logging.handlers import APILogHandler

        consoles = [*logging.getLogger("hermes").handlers, *logging.getLogger().handlers]  # ours propagate to root's
        quiet_prompts_on([h for h in consoles if not isinstance(h, APILogHandler)])
    link = PrefectLink.of_this_flow_run()
    with link.finish_without_it(lambda: rundir.run_dir(settings)):
        steps = PrefectSteps(task_runner, link, api_key_secret=api_key_secret, tool_secrets=tool_secrets)
        return orchestration.run(settings, steps, api_key=api_key_from_secret(api_key_secret))


if __name__ != "flows.batch":
    # Loaded by file path (a deployment's entrypoint flows/batch.py:batch_run), this module has a
    # name no other process can import, and the flow travels with each task to Dask workers by
    # that name. Hand out the installed module's flow instead: workers import flows.batch.
    import importlib

    batch_run = importlib.import_module("flows.batch").batch_run  # noqa: F811
