"""The tasks page: one row per task (a task folder, or a row's key without its attempt suffix), its
attempts' verdicts as a strip of marks, pass rate, mean turns and time, failure reasons; and the
same for two runs side by side (what B solved that A did not, what B lost).

Everything is grouped, filtered, sorted and paged in DuckDB: Python sees one page of tasks. An
attempt (one of --attempts, `hermes.trial`) can have several journal lines (a transient failure
put back in the queue); its outcome is its first line that did not fail, else its last, as the
merge picks a prompt's outcome.
"""
from __future__ import annotations

from typing import Any, Literal

import duckdb
from pydantic import BaseModel, Field

from hermes.run import rundir
from hermes.view.index import ViewIndex

PAGE_SIZE = 50
# each attempt's outcome line (see the module's docstring); `{where}` narrows the lines first
TRIALS = """trials AS (SELECT coalesce(min(pos) FILTER (WHERE status IS DISTINCT FROM 'failed'), max(pos)) AS pos
                       FROM entries {where} GROUP BY coalesce(key, pos::VARCHAR))"""
GROUPS = """g AS (SELECT e.task, min(e.pos) AS first, count(*) AS attempts,
                      count(*) FILTER (WHERE e.passed) AS passes, count(e.passed) AS checked,
                      count(*) FILTER (WHERE e.status = 'stopped') AS stopped,
                      count(*) FILTER (WHERE e.status = 'failed') AS failed,
                      list({'trial': e.trial, 'passed': e.passed, 'status': e.status, 'reward': e.reward,
                            'prompt_index': e.prompt_index, 'pos': e.pos} ORDER BY e.trial, e.pos) AS marks,
                      avg(e.api_calls) AS turns, avg(e.elapsed) AS seconds,
                      list(DISTINCT e.reason) FILTER (WHERE e.reason IS NOT NULL) AS reasons,
                      arg_min(left(e.prompt, 200), e.pos) AS prompt
               FROM trials JOIN entries e USING (pos) GROUP BY e.task)"""
PASS_RATE = "CASE WHEN checked > 0 THEN round(passes * 100.0 / checked, 1) END"
# the filters' names, as the page's select offers them
KINDS = {
    "unsolved": "passes = 0 AND checked > 0",
    "solved": "checked > 0 AND passes = checked",
    "flaky": "passes > 0 AND passes < checked",
    "unchecked": "checked = 0",
    # stopped by the attempt policy: a stopped line, or fewer attempts than K under a policy that skips
    "stopped": "(stopped > 0 OR (? AND attempts < ?))",
    "failed": "failed > 0",
}
SORTS = {"first": "first", "task": "task", "pass_rate": "pass_rate", "attempts": "attempts", "passes": "passes",
         "turns": "turns", "time": "seconds"}


class TaskFilters(BaseModel):
    kind: Literal["unsolved", "solved", "flaky", "unchecked", "stopped", "failed"] | None = None
    q: str | None = None
    sort: Literal["first", "task", "pass_rate", "attempts", "passes", "turns", "time"] = "first"
    desc: bool = False
    page: int = Field(1, ge=1)
    size: int = Field(PAGE_SIZE, ge=1, le=500)


def policy(index: ViewIndex) -> tuple[str, int]:
    """The run's attempt policy and K (run.json's settings; a run from before issue 46: all, K as given)."""
    settings = rundir.read_manifest(index.run_dir).get("settings") or {}
    k = settings.get("attempts")
    return str(settings.get("attempt_policy") or "all"), k if isinstance(k, int) and k > 0 else 1


def kind_sql(kind: str | None, index: ViewIndex) -> tuple[str, list]:
    if not kind:
        return "TRUE", []
    if kind == "stopped":
        name, k = policy(index)
        return KINDS[kind], [name != "all", k]
    return KINDS[kind], []


def _text_sql(q: str | None) -> tuple[str, list]:
    if not (q and q.strip()):
        return "TRUE", []
    return "(contains(lower(task), ?) OR contains(lower(prompt), ?))", [q.strip().lower()] * 2


def groups_sql() -> str:
    return f"WITH {TRIALS.format(where='')}, {GROUPS}"


def grouped(index: ViewIndex) -> str:
    """The name of a temporary table of the run's tasks (one row per task, GROUPS' columns and
    pass_rate), made again only when the index took new lines: paging, filtering and sorting
    10,000 tasks then reads 10,000 rows, not 80,000 entries."""
    index.refresh()
    with index.lock:
        if getattr(index, "_tasks_at", None) != index.generation:
            index.con.execute(f"CREATE OR REPLACE TEMP TABLE task_groups AS {groups_sql()} "
                              f"SELECT *, {PASS_RATE} AS pass_rate FROM g")
            index._tasks_at = index.generation
    return "task_groups"


def tasks(index: ViewIndex, f: TaskFilters) -> dict[str, Any]:
    g = grouped(index)
    kind, kp = kind_sql(f.kind, index)
    text, tp = _text_sql(f.q)
    where, params = f"WHERE {kind} AND {text}", kp + tp
    order = f"{SORTS[f.sort]} {'DESC' if f.desc else 'ASC'} NULLS LAST, first"
    (total, tasks_all, lines), = index.query(
        f"SELECT (SELECT count(*) FROM {g} {where}), (SELECT count(*) FROM {g}), (SELECT count(*) FROM entries)",
        params)
    rows = index.query(f"""SELECT task, attempts, passes, checked, pass_rate, stopped, failed, marks,
                                  turns, seconds, reasons, prompt
                           FROM {g} {where} ORDER BY {order} LIMIT ? OFFSET ?""",
                       params + [f.size, (f.page - 1) * f.size])
    keys = ("task", "attempts", "passes", "checked", "pass_rate", "stopped", "failed", "marks", "turns", "seconds",
            "reasons", "prompt")
    name, k = policy(index)
    return {"total": total, "tasks_total": tasks_all, "lines": lines, "page": f.page, "size": f.size,
            "attempt_policy": name, "attempts_k": k, "tasks": [dict(zip(keys, r)) for r in rows]}


def neighbour(index: ViewIndex, task: str, kind: str | None, step: int) -> str | None:
    """The next (step 1) or previous (-1) task after `task` in the run's order that `kind` admits,
    wrapping around; None: no other task does."""
    g = grouped(index)
    cond, params = kind_sql(kind, index)
    cmp, order = (">", "ASC") if step > 0 else ("<", "DESC")
    found = index.query(f"""WITH here AS (SELECT first FROM {g} WHERE task = ?)
                            SELECT task FROM {g} WHERE {cond} AND task <> ?
                            ORDER BY (first {cmp} coalesce((SELECT first FROM here), -1)) DESC, first {order} LIMIT 1""",
                        [task] + params + [task])
    return found[0][0] if found else None


# ---------------------------------------------------------------- two runs

class RunsFilters(BaseModel):
    change: Literal["solved", "lost", "changed", "same", "only_a", "only_b"] | None = None
    q: str | None = None
    sort: Literal["first", "task", "delta"] = "first"
    page: int = Field(1, ge=1)
    size: int = Field(PAGE_SIZE, ge=1, le=500)


CHANGES = {
    "solved": "a_passes = 0 AND b_passes > 0",   # solved in B (a task both runs ran)
    "lost": "a_passes > 0 AND b_passes = 0",     # lost in B
    "changed": "a_rate IS DISTINCT FROM b_rate",
    "same": "a_rate IS NOT DISTINCT FROM b_rate AND a_attempts > 0 AND b_attempts > 0",
    "only_a": "b_attempts IS NULL",
    "only_b": "a_attempts IS NULL",
}


def _per_task(index: ViewIndex):
    g = grouped(index)
    return index.arrow(f"SELECT task, first, attempts, passes, checked, pass_rate AS rate, marks, prompt FROM {g}")


def runs(a: ViewIndex, b: ViewIndex, f: RunsFilters) -> dict[str, Any]:
    """Two runs' tasks joined on the task: both pass rates and what changed. Each run's per-task rows
    (one per task, not per entry) cross as Arrow tables into an in-memory DuckDB that joins and pages them."""
    ta, tb = _per_task(a), _per_task(b)  # noqa: F841 (DuckDB reads them by name)
    con = duckdb.connect(":memory:")
    try:
        con.execute("""CREATE TEMP TABLE j AS SELECT coalesce(ta.task, tb.task) AS task,
                           coalesce(ta.first, 9223372036854775807) AS a_first, tb.first AS b_first,
                           ta.attempts AS a_attempts, ta.passes AS a_passes, ta.checked AS a_checked, ta.rate AS a_rate,
                           ta.marks AS a_marks, tb.attempts AS b_attempts, tb.passes AS b_passes,
                           tb.checked AS b_checked, tb.rate AS b_rate, tb.marks AS b_marks,
                           coalesce(ta.prompt, tb.prompt) AS prompt
                       FROM ta FULL OUTER JOIN tb ON ta.task = tb.task""")
        conds, params = [CHANGES[f.change] if f.change else "TRUE"], []
        text, tp = _text_sql(f.q)
        conds.append(text)
        params += tp
        where = " WHERE " + " AND ".join(conds)
        order = {"first": "a_first, b_first", "task": "task",
                 "delta": "abs(coalesce(b_rate, 0) - coalesce(a_rate, 0)) DESC, a_first, b_first"}[f.sort]
        (total, count_solved, count_lost, all_tasks), = con.execute(
            f"""SELECT (SELECT count(*) FROM j{where}), (SELECT count(*) FROM j WHERE {CHANGES['solved']}),
                       (SELECT count(*) FROM j WHERE {CHANGES['lost']}), (SELECT count(*) FROM j)""", params).fetchall()
        (a_rate, b_rate), = con.execute(
            "SELECT round(sum(a_passes) * 100.0 / nullif(sum(a_checked), 0), 1), "
            "round(sum(b_passes) * 100.0 / nullif(sum(b_checked), 0), 1) FROM j").fetchall()
        cols = ("task", "a_attempts", "a_passes", "a_checked", "a_rate", "a_marks", "b_attempts", "b_passes",
                "b_checked", "b_rate", "b_marks", "prompt")
        rows = con.execute(f"SELECT {', '.join(cols)} FROM j{where} ORDER BY {order} LIMIT ? OFFSET ?",
                           params + [f.size, (f.page - 1) * f.size]).fetchall()
    finally:
        con.close()
    out = []
    for r in rows:
        d = dict(zip(cols, r))
        d["change"] = next((c for c in ("only_a", "only_b", "solved", "lost") if _is(c, d)), "changed"
                           if d["a_rate"] != d["b_rate"] else "same")
        out.append(d)
    return {"total": total, "tasks_total": all_tasks, "solved_in_b": count_solved, "lost_in_b": count_lost,
            "a_pass_rate": a_rate, "b_pass_rate": b_rate, "page": f.page, "size": f.size, "tasks": out}


def _is(change: str, d: dict) -> bool:
    if change == "only_a":
        return d["b_attempts"] is None
    if change == "only_b":
        return d["a_attempts"] is None
    if change == "solved":
        return d["a_passes"] == 0 and d["b_passes"] > 0
    return d["a_passes"] > 0 and d["b_passes"] == 0
