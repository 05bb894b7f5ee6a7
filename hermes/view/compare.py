"""The compare view's data: attempts (of one task, of any entries, of one task in two runs) as
columns, their steps aligned into rows (hermes.view.align), each column headed by its verdict,
reward and the verifier's output tail.

Only the compared lines are read (at their offsets in the batch files); which lines those are is
a DuckDB question (the task's attempts, each attempt's outcome line: hermes.view.tasks.TRIALS).
"""
from __future__ import annotations

from typing import Any

from hermes.view import align
from hermes.view.index import ViewIndex
from hermes.view.tasks import TRIALS

MAX_COLUMNS = 16
REWARD_TAIL = 1200  # characters of the verifier's output shown in a column's head
_COLS = 'pos, prompt_index, task, trial, status, passed, reward, stop_reason, error, reason, api_calls, elapsed, batch_num, "offset", length'


def task_lines(index: ViewIndex, task: str) -> list[tuple]:
    index.refresh()
    return index.query(f"""WITH {TRIALS.format(where='WHERE task = ?')}
                           SELECT {_COLS} FROM trials JOIN entries USING (pos) ORDER BY trial, pos""", [task])


def entry_lines(index: ViewIndex, wanted: list[tuple[int, int | None]]) -> list[tuple]:
    """The named entries' lines, in the order named: (prompt_index, attempt) is that attempt's line
    (its first that did not fail, else its last); (prompt_index, None) each attempt of that prompt."""
    index.refresh()
    found = index.query(f"""WITH {TRIALS.format(where='WHERE list_contains(?, prompt_index)')}
                            SELECT {_COLS} FROM trials JOIN entries USING (pos) ORDER BY trial, pos""",
                        [sorted({pi for pi, _ in wanted})])
    return [r for pi, trial in wanted for r in found if r[1] == pi and trial in (None, r[3])]


def compare(lines: list[tuple[str | None, ViewIndex, tuple]], ref: int = 0) -> dict[str, Any]:
    """`lines`: (run label or None, its index, its row from task_lines/entry_lines), in column order;
    `ref` picks the reference column (moved first)."""
    lines = lines[:MAX_COLUMNS]
    if 0 < ref < len(lines):
        lines = [lines[ref]] + lines[:ref] + lines[ref + 1:]
    columns, sigs = [], []
    for run, index, row in lines:
        r = dict(zip([c.strip('"') for c in _COLS.split(", ")], row))
        line = index.read_line(r["batch_num"], r["offset"], r["length"])
        head, steps = align.steps(line.get("conversations") or [])
        reward = line.get("reward") if isinstance(line.get("reward"), dict) else None
        output = str((reward or {}).get("output") or "")
        columns.append({
            "run": run, "pos": r["pos"], "prompt_index": r["prompt_index"], "task": r["task"], "trial": r["trial"],
            "status": r["status"], "passed": r["passed"], "reward": r["reward"], "stop_reason": r["stop_reason"],
            "error": r["error"], "reason": r["reason"], "api_calls": r["api_calls"], "elapsed": r["elapsed"],
            "exit_code": (reward or {}).get("exit_code"), "reward_tail": output[-REWARD_TAIL:],
            "reward_cut": len(output) > REWARD_TAIL or bool((reward or {}).get("truncated")),
            "prompt": next((t["content"] for t in head if t["from"] == "human"), ""),
            "steps": steps,
        })
        sigs.append([s["sig"] for s in steps])
    rows = align.align(sigs)
    first, per = align.divergence(sigs, rows)
    return {"columns": columns, "rows": rows, "first_divergence": first, "diverges_at": per,
            "algorithm": "Needleman-Wunsch (match +2, mismatch -1, gap -1), progressive against the first column; "
                         "a step is an assistant turn: its tool calls (name, canonical arguments) or its text"}
