"""Attempt policies (--attempt_policy): which of a task's --attempts K run, decided from the verdicts
in the journal as they land.

    all          every attempt (today's behaviour; with --attempt_budget, handed out round by round)
    first_pass   attempts one after another (--attempt_parallelism P at a time), none after the
                 first whose check passed: one verified pass per task, for SFT by rejection sampling
    informative  --min_attempts m first; a task all of whose m passed stops (its group carries no
                 signal); otherwise attempts go on up to K until the group holds a pass and a fail

A policy is one SQL expression over a task's state (registered in POLICIES), read by one query over the
run's index: the dataset's keys (every attempt of every row, hermes.data.run_index.load_dataset) joined
with the journal's outcomes. Nothing else is remembered, so a run killed at any moment and resumed
reaches the same decisions. A task's state, per row of the dataset:

    passes    its attempts whose check passed          fails   those judged and not passed (an
    started   attempts settled, in flight, or parked             attempt with no check counts as failed)
    inflight  attempts handed out and not yet landed

Settled: a line other than `failed` (a verdict, or `stopped`). Parked: handed out by this invocation
(one that failed is retried on the next --resume, as any failed prompt, never twice in one
invocation) or failed --max_attempts times (given up). What is neither is open: a policy's `new` says how many of a task's open attempts may
start now, lowest attempt numbers first.

--attempt_budget N: at most N attempt keys ever started (an attempt retried after an error counts
once). Whatever the policy, open attempts go out in this order: tasks without a pass first, then
those with the fewest attempts started, then dataset order; so a budget lands on unsolved tasks, and
without one every task's first attempt goes out before any second.
"""
from __future__ import annotations

from dataclasses import dataclass

from hermes.data.entry import Status

#: per policy: how many open attempts of a task may start now (columns as in the module's doc, and
#: the settings k, m, p); `stops`: whether a task's siblings still in flight are stopped once it passed
POLICIES: dict[str, dict] = {
    # with a budget, P at a time, each chosen after the verdicts before it: a budget goes to tasks
    # without a pass only if their verdicts are in when it is handed out
    "all": {"new": "CASE WHEN budgeted THEN greatest(0, least(p - inflight, k - started)) ELSE k - started END",
            "stops": False},
    "first_pass": {"new": "CASE WHEN passes > 0 THEN 0 ELSE greatest(0, least(p - inflight, k - started)) END",
                   "stops": True},
    "informative": {"new": """CASE WHEN started < m THEN m - started WHEN passes > 0 THEN 0
                              ELSE greatest(0, least(p - inflight, k - started)) END""",
                    "stops": False},
}

_F, _S = f"'{Status.FAILED}'", f"'{Status.STOPPED}'"

# One row per attempt of the dataset with its state, then one per task (a dataset row: idx).
_STATE = f"""
WITH o AS (SELECT key, count(*) FILTER (WHERE status <> {_F}) AS ok,
                  coalesce(bool_or(passed) FILTER (WHERE status <> {_F}), false) AS passed,
                  count(*) FILTER (WHERE status = {_S}) AS stopped, count(*) AS tries
           FROM outcomes WHERE key IS NOT NULL GROUP BY key),
a AS (SELECT d.idx, d.rowid AS rid, d.key, coalesce(o.ok, 0) > 0 AS settled,
             coalesce(o.ok, 0) > 0 AND o.stopped = 0 AND o.passed AS pass,
             coalesce(o.ok, 0) > 0 AND o.stopped = 0 AND NOT o.passed AS fail,
             list_contains($flying, d.key) AS flying,
             d.key IN (SELECT key FROM handed) OR (coalesce(o.ok, 0) = 0 AND coalesce(o.tries, 0) >= $max_tries) AS parked
      FROM dataset d LEFT JOIN o USING (key)),
t AS (SELECT idx, count(*) FILTER (WHERE pass) AS passes, count(*) FILTER (WHERE fail) AS fails,
             count(*) FILTER (WHERE settled OR flying OR parked) AS started,
             count(*) FILTER (WHERE flying) AS inflight,
             $k AS k, $m AS m, $p AS p, $budgeted AS budgeted
      FROM a GROUP BY idx)
"""


@dataclass(frozen=True)
class AttemptPolicy:
    """A run's policy with its settings; `dynamic`: the run's attempts are planned as verdicts land."""

    name: str = "all"
    k: int = 1
    m: int = 2
    p: int = 1
    budget: int | None = None
    max_tries: int | None = None  # --max_attempts: an attempt failed this often is given up

    @classmethod
    def of(cls, settings) -> "AttemptPolicy":
        if settings.attempt_policy not in POLICIES:
            raise ValueError(f"unknown attempt policy {settings.attempt_policy!r}: one of {', '.join(POLICIES)}")
        return cls(name=settings.attempt_policy, k=settings.attempts, m=min(settings.min_attempts, settings.attempts),
                   p=settings.attempt_parallelism, budget=settings.attempt_budget, max_tries=settings.max_attempts)

    @classmethod
    def of_manifest(cls, settings: dict) -> "AttemptPolicy":
        """The policy a run folder's run.json settings name (runs from before policies: all)."""
        k = int(settings.get("attempts") or 1)
        return cls(name=settings.get("attempt_policy") or "all", k=k, m=min(int(settings.get("min_attempts") or 2), k),
                   p=int(settings.get("attempt_parallelism") or 1), budget=settings.get("attempt_budget"),
                   max_tries=settings.get("max_attempts"))

    def why_no_pass_at_k(self) -> str:
        if self.name == "all":
            return (f"--attempt_budget {self.budget} ran some tasks fewer than {self.k} attempts, chosen by earlier "
                    f"verdicts: the unbiased estimator needs K independent attempts per task")
        return (f"--attempt_policy {self.name} stops a task's attempts on their verdicts: the unbiased estimator "
                f"needs K independent attempts per task; see attempt_policy (tasks solved, solve rate)")

    def statistics(self, trials: dict[str, list], *, tasks: int, stopped: int, failed: int) -> dict:
        """statistics.json's `attempt_policy`: what the run spent and what it bought. trials: per task
        [judged attempts, passes] (hermes.data.stats.add_trial); tasks: the dataset's rows."""
        judged = sum(n for n, _ in trials.values())
        solved = sum(1 for _, c in trials.values() if c)
        spent = judged + stopped + failed
        signal = sum(1 for n, c in trials.values() if 0 < c < n)
        return {
            "policy": self.name, "k": self.k,
            **({"min_attempts": self.m} if self.name == "informative" else {}),
            "attempt_parallelism": self.p, "budget": self.budget,
            "tasks": tasks, "tasks_judged": len(trials), "tasks_solved": solved,
            "solve_rate": round(solved / tasks, 6) if tasks else None,
            # spent: every attempt with a line (judged, stopped in flight, or failed with an error)
            "attempts_spent": spent, "attempts_run": judged + failed,  # run: to a verdict or an error
            "attempts_judged": judged, "attempts_stopped": stopped,
            "attempts_failed": failed,
            "attempts_saved": max(0, tasks * self.k - spent),  # against --attempt_policy all
            "attempts_per_solved_task": round(spent / solved, 3) if solved else None,
            # RL groups: tasks whose attempts hold both a pass and a fail (the others carry no gradient)
            "groups_with_signal": signal,
            "groups_with_signal_share": round(signal / len(trials), 6) if trials else None,
            "groups": {name: {"passes": c, "fails": n - c} for name, (n, c) in sorted(trials.items())},
        }

    @property
    def decides(self) -> bool:
        """Whether verdicts change what runs (a pass ends a task's attempts)."""
        return self.name != "all"

    @property
    def stops_siblings(self) -> bool:
        return bool(POLICIES[self.name]["stops"])

    @property
    def dynamic(self) -> bool:
        return self.name != "all" or self.budget is not None

    @staticmethod
    def begin(con) -> None:
        """This invocation's record of the attempts it handed out (a table of the index: it may be long)."""
        con.execute("CREATE OR REPLACE TEMP TABLE handed (key VARCHAR)")

    @staticmethod
    def handing_out(con, keys: list[str]) -> None:
        con.execute("INSERT INTO handed SELECT unnest($keys)", {"keys": keys})

    def _params(self, flying: list[str]) -> dict:
        return {"flying": flying, "budgeted": self.budget is not None, "max_tries": self.max_tries or 2 ** 62,
                "k": self.k, "m": self.m, "p": self.p}

    def next_attempts(self, index, flying: list[str], limit: int) -> list[tuple[int, str]]:
        """(row index, key) of up to `limit` attempts to start now, in hand-out order (the module's doc).

        index: the run's RunIndex (its dataset, outcomes and handed tables); flying: keys handed out and
        not landed."""
        if self.budget is not None:
            spent = index.query("SELECT count(*) FROM (SELECT key FROM outcomes WHERE key IS NOT NULL "
                                "UNION SELECT key FROM handed)")[0][0]
            limit = min(limit, self.budget - spent)
        if limit <= 0:
            return []
        sql = _STATE + f"""
            , c AS (SELECT a.idx, a.key, t.passes, t.started,
                           row_number() OVER (PARTITION BY a.idx ORDER BY a.rid) AS rank,
                           ({POLICIES[self.name]["new"]}) AS new
                    FROM a JOIN t USING (idx) WHERE NOT (a.settled OR a.flying OR a.parked))
            SELECT idx, key FROM c WHERE rank <= new
            ORDER BY passes > 0, started + rank, idx"""
        # the first `limit` rows read off the sorted result: DuckDB's top-N (ORDER BY .. LIMIT) asked for
        # more than the run index's 16 MB cap however few the rows (1.4.x), a sort spills instead
        return index.query(sql, self._params(flying), limit=limit)
