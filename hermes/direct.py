"""A whole run in plain Python, without Prefect (`hermes-batch run --engine direct`).

The same steps as flows/batch.py, on the same domain functions, so a run started one way
resumes the other way: open -> plan -> fan batches out (prompts in flight bounded by
--num_workers) -> record each batch as it lands -> merge -> fail if too many prompts failed.
What it skips is the orchestrator: no Prefect server to boot or reach, no flow/task-run
records, no artifacts; the journal, index, checkpoint and outputs are identical.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from hermes import merge, runner
from hermes.outcome import check_failed_share
from hermes.progress import ProgressLine
from hermes.session import RunSession
from hermes.settings import RunSettings


def run(settings: RunSettings, *, api_key: str | None = None) -> dict[str, Any]:
    session = RunSession.open(settings, api_key=api_key)
    try:
        batches = session.plan()
        session.ctx.on_prompt_done = ProgressLine(total=sum(len(b.rows) for b in batches)).prompt_done
        with ThreadPoolExecutor(max_workers=settings.num_workers, thread_name_prefix="batch") as pool:
            futures = {pool.submit(runner.run_batch, b.num, b.rows, session.ctx): b for b in batches}
            for future in as_completed(futures):
                session.record(futures[future])
                future.result()
    finally:
        session.close()
    stats = merge.merge(session.path)
    check_failed_share(stats, settings.max_failed_share, session.path)
    return stats
