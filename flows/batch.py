"""The batch-run flow: the whole life of a run on one screen.

open (refuse/resume, lock, validate) -> plan what is owed -> fan batches out (prompts in
flight bounded by --num_workers) -> record each batch as it lands -> merge.
"""
from __future__ import annotations

from prefect import flow
from prefect.futures import as_completed
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from flows.merge import merge
from hermes.session import RunSession
from hermes.settings import RunSettings
from tasks.progress import RunProgress
from tasks.run import plan, record, run_batch


def _flow_run_name() -> str:
    settings = flow_run.parameters.get("settings") or {}
    name = settings.run_name if isinstance(settings, RunSettings) else settings.get("run_name", "run")
    return f"batch-{name}"


@flow(name="batch-run", flow_run_name=_flow_run_name)
def batch_run(settings: RunSettings) -> dict:
    session = RunSession.open(settings)
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
    return merge(settings.run_name, settings.output_dir)
