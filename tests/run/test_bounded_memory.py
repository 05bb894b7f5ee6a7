"""What a run holds grows with the prompts in flight, not with the dataset (issue 34).

A real direct run in this process (the bundled model server, the local sandbox backend), watched
from its own progress callback: every few finished prompts the garbage collector's view of the heap
counts the dataset rows alive (hermes.data.dataset.Row) and the batches started and not yet landed.
A run that handed every batch out at its start, or kept each batch's rows to its end, holds every
row of the dataset; this one holds the batches in flight.
"""
from __future__ import annotations

import collections
import gc

from hermes.data.dataset import Row
from hermes.run import orchestration
from hermes.run.session import Batch
from hermes.settings import RunSettings
from tests.helpers import read_jsonl, write_dataset

PROMPTS, WORKERS, BATCH = 240, 4, 3


class Watched(orchestration.Steps):
    def __init__(self, census: bool = False):
        self.census = census  # the slower count by type: only where asked, so the row counts keep their pace
        self.rows_alive: list[int] = []
        self.batches_alive: list[int] = []
        self.ours_alive: list[collections.Counter] = []

    def progress(self, run_name, total):
        show = super().progress(run_name, total)
        seen = 0

        def prompt_done(entry):
            nonlocal seen
            seen += 1
            if seen % 20 == 0:
                gc.collect()  # what is still referenced, not garbage the collector has yet to free
                alive = gc.get_objects()
                self.rows_alive.append(sum(isinstance(o, Row) for o in alive))
                self.batches_alive.append(sum(isinstance(o, Batch) for o in alive))
                if self.census:
                    self.ours_alive.append(collections.Counter(
                        type(o).__qualname__ for o in alive if type(o).__module__.startswith("hermes.")))
                del alive  # a list of every object would keep each of them alive
            show(entry)
        return prompt_done


def test_rows_alive_are_bounded_by_the_prompts_in_flight(tmp_path, mock_llm):
    dataset = write_dataset(tmp_path / "many.jsonl", [{"prompt": f"row {i}"} for i in range(PROMPTS)])
    settings = RunSettings(dataset_file=str(dataset), run_name="bounded", output_dir=str(tmp_path / "data"),
                           batch_size=BATCH, num_workers=WORKERS, base_url=mock_llm.base_url, model="m",
                           distribution="terminal_only", sandbox={"backend": "local"})
    steps = Watched()
    stats = orchestration.run(settings, steps, api_key="k")
    assert stats["prompts_completed"] == PROMPTS
    assert len(read_jsonl(tmp_path / "data" / "bounded" / "trajectories.jsonl")) == PROMPTS
    assert len(steps.rows_alive) == PROMPTS // 20
    # in flight (WORKERS), queued for a slot (a window of WORKERS, a batch's overshoot), and the rest
    # of each batch a straggler still holds: never the dataset's PROMPTS
    bound = WORKERS + WORKERS + BATCH + WORKERS * BATCH
    assert max(steps.rows_alive) <= bound, steps.rows_alive
    # the plan makes its batches as they are handed out: those in flight and the next, never the
    # run's PROMPTS // BATCH (a plan that is a list holds every one, and a pair per prompt in them)
    assert max(steps.batches_alive) <= WORKERS + WORKERS // BATCH + 2 + WORKERS, steps.batches_alive


def test_no_object_of_ours_piles_up_batch_after_batch(tmp_path, mock_llm):
    """Any object of hermes' own kept a batch (a per-file lock, a record per landing) grows between
    the run's first and second half by the batches landed in between; what is in flight does not."""
    dataset = write_dataset(tmp_path / "many.jsonl", [{"prompt": f"row {i}"} for i in range(PROMPTS)])
    settings = RunSettings(dataset_file=str(dataset), run_name="piles", output_dir=str(tmp_path / "data"),
                           batch_size=BATCH, num_workers=WORKERS, base_url=mock_llm.base_url, model="m",
                           distribution="terminal_only", sandbox={"backend": "local"})
    steps = Watched(census=True)
    assert orchestration.run(settings, steps, api_key="k")["prompts_completed"] == PROMPTS
    half = len(steps.ours_alive) // 2
    first, second = steps.ours_alive[1:half], steps.ours_alive[half:]  # the first sample: still starting
    kinds = set().union(*steps.ours_alive)
    assert {"Row", "Batch"} <= kinds  # it sees our objects at all
    # 40 batches land between the halves' midpoints: a batch's leftover shows as 40 more
    grown = {kind: (max(c[kind] for c in first), max(c[kind] for c in second)) for kind in kinds}
    piled = {kind: counts for kind, counts in grown.items() if counts[1] > counts[0] + WORKERS * BATCH}
    assert not piled, piled
