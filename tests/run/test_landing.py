"""Batches are handed out as slots free, and every owed batch is handed out before the run ends.

Found by a 200,000-prompt run (issue 34): the run ended with exit 0 after 13,230 to 82,730
prompts. The last batches in flight landed while the flow recorded an earlier one; they were
taken off the landed queue one after the other with no look at the slots in between, and with
nothing left in flight the hand-out loop ended, batches still owed. Here the same order of events
is played with real futures and the real Admission: the test is the flow recording a batch, and
finishes the batch in flight meanwhile.
"""
from __future__ import annotations

import concurrent.futures
import threading

from hermes.run import orchestration
from hermes.run.admission import Admission
from hermes.run.session import Batch


class Ctx:
    def __init__(self, ahead: int):
        self.admission = Admission(ahead=ahead)


def test_every_owed_batch_is_handed_out_when_the_last_in_flight_land_during_a_record():
    ctx = Ctx(ahead=1)
    batches = [Batch(n, [(n, f"key-{n}")]) for n in range(3)]
    futures: dict[int, concurrent.futures.Future] = {}

    def submit(batch, _ctx):
        futures[batch.num] = concurrent.futures.Future()
        return futures[batch.num]

    def finish(num: int) -> None:
        """A batch's one prompt takes its slot, ends, and the batch lands (as runner._run_batch does)."""
        ctx.admission.started()
        futures[num].set_result({"completed": 1})

    gen = orchestration.landing(batches, submit, ctx, orchestration.Steps())
    # batch 0 goes out (one prompt queued fills the window); it lands from another thread
    threading.Timer(0.05, finish, [0]).start()
    batch, _ = next(gen)
    assert batch.num == 0 and sorted(futures) == [0, 1]  # batch 0's landing freed the window for batch 1
    # While the flow records batch 0, batch 1 starts, finishes and lands: nothing is in flight now.
    finish(1)
    landed = [batch.num] + [b.num for b, _ in _drain(gen, futures, finish)]
    assert landed == [0, 1, 2], landed  # batch 2 was owed: it went out and landed too


def test_a_batch_is_handed_out_when_nothing_is_in_flight_whatever_the_count_says():
    """A queued count that never came back down (a prompt that never told it started) must not
    end the run with batches owed: with nothing in flight, the next batch goes out."""
    ctx = Ctx(ahead=1)
    batches = [Batch(n, [(n, f"key-{n}")]) for n in range(3)]

    def submit(batch, _ctx):
        done = concurrent.futures.Future()
        done.set_result({"completed": 1})  # lands at once, its prompt never counted as started
        return done

    landed = [b.num for b, _ in orchestration.landing(batches, submit, ctx, orchestration.Steps())]
    assert landed == [0, 1, 2]


def _drain(gen, futures, finish):
    """The rest of the generator, finishing each batch it hands out after it was handed out."""
    seen = set()
    while True:
        for num in sorted(set(futures) - seen):
            seen.add(num)
            if not futures[num].done():
                threading.Timer(0.05, finish, [num]).start()
        try:
            yield next(gen)
        except StopIteration:
            return
