"""The plan of a run under an attempt policy (hermes.run.attempt_policy): batches made as verdicts land.

A static plan (hermes.run.session.Plan) numbers every owed prompt at the start. Here a batch is made
when the run can take one: the policy's query over the index says which attempts may start now, and
a task's next attempt appears only once the verdicts it depends on have landed. Walking the plan
yields a Batch, or WAIT when nothing may start until a batch in flight lands (the fan-out then waits
for a landing, hermes.run.orchestration.landing), and ends when nothing may start and nothing is in
flight. The caller reports each landed batch (landed); what is in flight is the only state kept here,
so memory follows the prompts in flight and a resume re-derives every decision from the journal.

Under first_pass with --attempt_parallelism > 1, attempts of a task still in flight when a sibling's
pass lands are handed to `stop` (hermes.run.stops: stopped and recorded as such where they run in
this process).
"""
from __future__ import annotations

import logging
from typing import Callable, Iterator

from hermes.data.dataset import Dataset
from hermes.data.run_index import RunIndex
from hermes.run.attempt_policy import AttemptPolicy

log = logging.getLogger(__name__)


class _Wait:
    """Nothing may start until a batch in flight lands."""

    def __repr__(self) -> str:
        return "WAIT"


WAIT = _Wait()


class PolicyPlan:
    """Batches of the attempts a policy wants, made as the run goes. Walk it in the thread that owns
    the index (the flow's). len() and .prompts are upper bounds (every attempt still open)."""

    dynamic = True

    def __init__(self, index: RunIndex, dataset: Dataset | None, policy: AttemptPolicy, *, batch: Callable,
                 first: int, size: int, prompts: int, lookahead: int, refresh: Callable[[], None] = lambda: None,
                 stop: Callable[[list[str]], None] | None = None):
        self.index, self.dataset, self.policy, self.batch = index, dataset, policy, batch  # batch(num, wanted, dataset)
        self.first, self.size, self.prompts = first, size, prompts
        self.lookahead = max(lookahead, size)  # attempts asked for at once: enough to fill the slots
        self.refresh, self.stop = refresh, stop
        self.on_batch: Callable[[int], None] | None = None  # told each batch number handed out
        self._flying: dict[int, list[str]] = {}  # batch number -> its keys, until it lands
        self._buffer: list[tuple[int, str]] = []
        self._stale = True  # something landed since the buffer was filled
        self._stopped: set[str] = set()
        self.handed_out = 0
        policy.begin(index.con)

    def __len__(self) -> int:
        return -(-self.prompts // self.size)

    def landed(self, num: int) -> None:
        if self._flying.pop(num, None) is not None:
            self._stale = True

    def flying(self) -> list[str]:
        return [k for keys in self._flying.values() for k in keys]

    def __iter__(self) -> Iterator:
        num = self.first
        while True:
            if self._stale:
                self._replan()
            if not self._buffer:
                if not self._flying:
                    return
                yield WAIT
                continue
            wanted, self._buffer = self._buffer[:self.size], self._buffer[self.size:]
            self._flying[num] = [k for _, k in wanted]
            self.policy.handing_out(self.index.con, self._flying[num])
            self.handed_out += len(wanted)
            if self.on_batch:
                self.on_batch(num)
            yield self.batch(num, wanted, self.dataset)
            num += 1

    def _replan(self) -> None:
        """Read what landed, stop what a pass made moot, and ask the policy for the attempts to start."""
        self.refresh()  # the index holds every landed batch's lines
        flying = self.flying()
        if self.stop and (moot := [k for k in self.policy.to_stop(self.index.con, flying)
                                   if k not in self._stopped]):
            self._stopped.update(moot)
            log.info("attempt policy: stopping %d attempt(s) in flight whose task already passed", len(moot))
            self.stop(moot)
        self._buffer = self.policy.next_attempts(self.index.con, flying, self.lookahead)
        self._stale = False
