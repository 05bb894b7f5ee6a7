"""One run's life: plan, batches, prompts in flight, the run folder, merge, status.

    orchestration.py    the run's steps, shared by the Prefect flow and --engine direct
    direct.py           --engine direct: the same steps without Prefect
    session.py          planning: the DuckDB index, what is owed, the batches (RunSession, Batch)
    runner.py           a batch's prompts, each to a journal entry (RunContext, run_batch)
    requeue.py          prompts that failed for a transient reason, run again (RetryPolicy)
    remote.py           a batch on a Dask worker or another process
    local_processes.py  --worker_processes: worker processes of this machine
    clusters.py         --cluster: where the run's Dask workers come from (a registry: local, slurm)
    slurm.py            --cluster slurm: Dask workers as Slurm jobs (dask-jobqueue), swept when their run died
    workerfiles.py      the prompts in flight of each worker, for `status`
    rundir.py           the run folder: its lock, its settings, refusals (RunLock, RunRefused)
    progress.py         the progress line and the journal's tail
    merge.py            trajectories.jsonl and statistics.json from the journal
    status.py           `hermes-batch status`: done, failed, owed
    summary.py          the terminal's end-of-run summary (and the Prefect report's)
    export.py           `hermes-batch export`: OpenAI messages with tool_calls, ShareGPT, Parquet

The top layer of hermes/: it may import agent/, model/, data/, tools/, sandbox/; nothing imports it
but flows/, tasks/, the API server and the viewer (hermes/view).
"""
from hermes.lazyimport import lazy_surface

__getattr__, __all__ = lazy_surface(__name__, {
    "RunSession": "session",
    "Batch": "session",
    "RunContext": "runner",
    "run_batch": "runner",
    "RetryPolicy": "requeue",
    "RunLock": "rundir",
    "RunRefused": "rundir",
    "run_status": "status",
    "format_status": "status",
})
