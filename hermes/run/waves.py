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
import threading
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
        self.lookahead = max(lookahead, size)  # attempts asked of the index at once
        self.refresh, self.stop = refresh, stop
        self.on_batch: Callable[[int], None] | None = None  # told each batch number handed out
        self._flying: dict[int, list[tuple[int, str]]] = {}  # batch number -> its (row, key), until it lands
        self._landed: list[list[tuple[int, str]]] = []  # landed since last looked at
        self._buffer: list[tuple[int, str]] = []  # attempts the last query allowed, not handed out yet
        self._asked = False  # the index was asked since the last landing
        self._stopped: set[str] = set()
        #: tasks whose pass was written by a prompt of this process and whose batch has not landed yet
        self._passed: dict[int, str] = {}  # task -> the key that passed
        self._fresh_pass = False  # a pass arrived since the buffer was last filtered
        self._lock = threading.Lock()  # _flying, _stopped, _passed: verdicts arrive on the prompts' loop
        self.handed_out = 0
        policy.begin(index.con)

    def __len__(self) -> int:
        return -(-self.prompts // self.size)

    def landed(self, num: int) -> None:
        with self._lock:
            pairs = self._flying.pop(num, None)
        if pairs is not None:
            self._landed.append(pairs)

    def flying(self) -> list[str]:
        with self._lock:
            return [k for pairs in self._flying.values() for _, k in pairs]

    def verdict(self, record: dict) -> None:
        """A prompt of this process finished (its journal line; any thread). A pass is known from here
        on, before its batch lands and the index has it (a sibling may share its batch): no more of its
        task's attempts start, and under first_pass its siblings in flight are stopped at once."""
        reward = record.get("reward")
        if not (self.policy.decides and isinstance(reward, dict) and reward.get("passed")):
            return
        task = record.get("prompt_index")
        with self._lock:
            self._passed[task] = (record.get("hermes") or {}).get("key")
            self._fresh_pass = True
        if self.stop and self.policy.stops_siblings:
            self._stop_siblings({task}, passed=(record.get("hermes") or {}).get("key"))

    def _unsolved(self, wanted: list[tuple[int, str]]) -> list[tuple[int, str]]:
        """Attempts of tasks not known to have passed (the index may not have the pass yet)."""
        with self._lock:
            self._fresh_pass = False
            return [(i, k) for i, k in wanted if i not in self._passed] if self._passed else wanted

    def __iter__(self) -> Iterator:
        num = self.first
        while True:
            if self._landed:
                self._take_landed()
            if not self._buffer and not self._asked:
                # A query over the whole index (about half a second at 80,000 attempts): asked when the
                # attempts it allowed last time are all handed out and something landed since, not at
                # every landing. What it allowed stays allowed: a task's next attempt is open only when
                # none of it is in flight (P = 1), and a pass that lands drops its task's (_take_landed).
                self._buffer = self._unsolved(self.policy.next_attempts(self.index, self.flying(), self.lookahead))
                self._asked = True
            if not self._buffer:
                if not self._flying:
                    return
                yield WAIT
                continue
            if self._fresh_pass:  # filtered again only when a pass came in, not at every hand-out
                self._buffer = self._unsolved(self._buffer)
                if not self._buffer:
                    continue
            wanted, self._buffer = self._buffer[:self.size], self._buffer[self.size:]
            with self._lock:
                self._flying[num] = wanted
            self.policy.handing_out(self.index.con, [k for _, k in wanted])
            self.handed_out += len(wanted)
            if self.on_batch:
                self.on_batch(num)
            yield self.batch(num, wanted, self.dataset)
            num += 1

    def _take_landed(self) -> None:
        """Index what landed; a task that passed in it gets no more of the attempts already allowed,
        and under first_pass its siblings in flight are stopped."""
        self.refresh()  # the index holds every landed batch's lines
        landed, self._landed = self._landed, []
        self._asked = False
        with self._lock:  # the index has these batches' passes now
            for pairs in landed:
                for i, k in pairs:
                    if self._passed.get(i) == k:
                        del self._passed[i]
        if not self.policy.decides:
            return
        task_of = {k: i for pairs in landed for i, k in pairs}
        passed = {task_of[k] for (k,) in self.index.query(
            "SELECT DISTINCT key FROM outcomes WHERE passed AND list_contains($keys, key)",
            {"keys": list(task_of)})}
        if not passed:
            return
        self._buffer = [(i, k) for i, k in self._buffer if i not in passed]
        if self.stop and self.policy.stops_siblings:
            self._stop_siblings(passed)

    def _stop_siblings(self, tasks: set, passed: str | None = None) -> None:
        with self._lock:
            moot = [k for pairs in self._flying.values() for i, k in pairs
                    if i in tasks and k != passed and k not in self._stopped]
            self._stopped.update(moot)
        if moot:
            log.info("attempt policy: stopping %d attempt(s) in flight whose task passed", len(moot))
            self.stop(moot)
