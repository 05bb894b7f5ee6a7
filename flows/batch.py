"""The batch-run flow: the whole life of a run on one screen.

open (refuse/resume, lock, validate) -> plan what is owed -> fan batches out (prompts in
flight bounded by --num_workers) -> record each batch as it lands -> merge -> report
-> fail the run if too many prompts failed.
"""
from __future__ import annotations

from datetime import datetime, timezone

from prefect import flow, get_run_logger
from prefect.futures import as_completed
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from flows.merge import merge_and_publish
from hermes.session import RunSession
from hermes.settings import RunSettings
from tasks.progress import RunProgress, started_in_this_flow_run
from tasks.report import TooManyFailedPrompts, check_failed_share  # noqa: F401  (re-exported)
from tasks.run import plan, record, run_batch


def _api_key(secret_name: str | None) -> str | None:
    """The model API key from a Prefect Secret block, when named; else hermes reads the environment."""
    if not secret_name:
        return None
    from prefect.blocks.system import Secret

    return str(Secret.load(secret_name).get())


def _stamp() -> str:
    """The run's scheduled start (UTC), for one run folder per scheduled run."""
    when = flow_run.scheduled_start_time or datetime.now(timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H%MZ")


def _run_name(settings: RunSettings | dict, stamp_run_name: bool) -> str:
    name = settings.run_name if isinstance(settings, RunSettings) else (settings or {}).get("run_name", "run")
    return f"{name}-{_stamp()}" if stamp_run_name else str(name)


def _flow_run_name() -> str:
    # Deployment runs may hand the parameters over as plain dicts, direct calls as models.
    params = flow_run.parameters
    return "batch-" + _run_name(params.get("settings"), bool(params.get("stamp_run_name")))


@flow(name="batch-run", flow_run_name=_flow_run_name)
def batch_run(settings: RunSettings, stamp_run_name: bool = False, api_key_secret: str | None = None) -> dict:
    """Run a tool-using agent over every prompt of a JSONL dataset, each prompt in its own Docker sandbox.

    Writes trajectories.jsonl and statistics.json into output_dir/run_name; resumable by prompt content.

    Args:
        settings: the run's settings (the batch_runner.py flags)
        stamp_run_name: append the run's scheduled start time (UTC) to run_name, so that each
            scheduled run gets its own output folder
        api_key_secret: name of a Prefect Secret block holding the model API key; unset: the
            worker's HERMES_API_KEY, OPENROUTER_API_KEY or OPENAI_API_KEY
    """
    if stamp_run_name:
        settings = settings.model_copy(update={"run_name": _run_name(settings, True)})
    if not settings.resume and started_in_this_flow_run(settings.run_name):
        # "Retry" in the UI: continue this flow run's own run (failed prompts run again), do not refuse it.
        get_run_logger().info("retry of flow run that already ran '%s': resuming it", settings.run_name)
        settings = settings.model_copy(update={"resume": True})
    session = RunSession.open(settings, api_key=_api_key(api_key_secret))
    try:
        batches = plan(session)
        progress = RunProgress(settings.run_name, total=sum(len(b.rows) for b in batches))
        session.ctx.on_prompt_done = progress.prompt_done
        with ThreadPoolTaskRunner(max_workers=settings.num_workers) as pool:
            futures = {pool.submit(run_batch, {"batch": b, "ctx": session.ctx}): b for b in batches}
            for future in as_completed(futures):
                record(session, futures[future])
                future.result()
    finally:
        session.close()
    stats = merge_and_publish(session.path, settings.max_failed_share)
    check_failed_share(stats, settings.max_failed_share, session.path)
    return stats

