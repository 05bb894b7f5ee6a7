"""A Prefect run holds what its batches in flight need, not something per batch it has run (issue 34).

The real batch-run flow in this process on the test harness's Prefect server, sixty one-prompt
batches (sixty task runs) two at a time; as the flow records every tenth batch that lands, the
test counts the threading.Event objects alive. Prefect's thread-pool task runner keeps one per task run it was
handed until the pool closes (a cancel switch, ~1.3 KB), and a task run's future has one: a run
that kept either for every batch holds sixty more at its end than at its start. It counts the
batches' final states too: Prefect's flow run context links each task run's result to a copy of
its state (for dependency edges) and never lets go while the flow runs.
"""
from __future__ import annotations

import gc
import threading

import pytest

from hermes.settings import RunSettings
from tests.helpers import unique_run, write_dataset

BATCHES = 60


def alive() -> tuple[int, int]:
    """(threading.Event objects, batch task runs' final states) alive now (a state another thread is
    still building has no message yet)."""
    from prefect.client.schemas.objects import State

    gc.collect()
    objects = gc.get_objects()
    try:
        return (sum(isinstance(o, threading.Event) for o in objects),
                sum(isinstance(o, State) and isinstance(getattr(o, "message", None), str) and o.message.startswith("batch ")
                    for o in objects))
    finally:
        del objects


@pytest.mark.usefixtures("prefect_harness")
def test_a_run_of_many_batch_task_runs_keeps_none_per_batch(tmp_path, mock_llm, monkeypatch):
    from flows.batch import batch_run
    from hermes.run.session import RunSession

    dataset = write_dataset(tmp_path / "many.jsonl", [{"prompt": f"row {i}"} for i in range(BATCHES)])
    settings = RunSettings(dataset_file=str(dataset), run_name=unique_run("events"), output_dir=str(tmp_path / "data"),
                           batch_size=1, num_workers=2, base_url=mock_llm.base_url, model="m",
                           distribution="terminal_only", sandbox={"backend": "local"})
    counts: list[tuple[int, int]] = []
    record = RunSession.record

    def counted(session, batch):  # every tenth batch that lands, as the flow records it
        record(session, batch)
        if session.prompts_run % 10 == 0:
            counts.append(alive())

    monkeypatch.setattr(RunSession, "record", counted)
    stats = batch_run(settings=settings)
    assert stats["trajectories_written"] == BATCHES
    assert len(counts) == BATCHES // 10, counts
    half = len(counts) // 2
    events, states = [c[0] for c in counts], [c[1] for c in counts]
    # Threads (an Event each: the pool's, Prefect's services) and the batches in flight hold some, as
    # many late as early; an Event kept a batch (a cancel switch, a landed future) adds one for each
    # of the thirty batches that land between the halves.
    assert max(events[half:]) <= max(events[:half]) + BATCHES // 6, counts
    # A batch's final state (its message "batch N: ...") while it lands, not after: the flow run's
    # context linked each task run's result to a copy of its state for the run's whole length.
    assert max(states) <= 2 * (2 + 1 + 2), counts
