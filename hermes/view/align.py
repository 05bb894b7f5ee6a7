"""Attempts side by side, turn by turn: each attempt's conversation as a sequence of steps, and the
steps of N attempts aligned into rows so that matching steps sit side by side.

A step is one assistant turn with the tool results that answer it. Its signature is what it did:
its tool calls as (name, canonical arguments: JSON with sorted keys), or, for a turn without calls,
its text lowercased with whitespace collapsed. Reasoning and tool results are not part of it (a
clock or a temp path in an output would split steps that did the same thing).

Alignment: Needleman–Wunsch global alignment (match +2, mismatch -1, gap -1), progressive: the
first column is the reference; each further column is aligned against the rows built so far, a
step matching a row when its signature equals any step's already in that row. A mismatch costs
less than two gaps, so two attempts that did different things at the same point stay on one row
(turn by turn), while an extra step in one attempt opens a gap row. The first divergence is the
first row where the columns do not all hold the same signature; each column also gets its own
first row that differs from the reference column. Attempts too long for the quadratic table
(QUADRATIC_CELLS) are matched with difflib's SequenceMatcher instead.
"""
from __future__ import annotations

import difflib
import json
from typing import Any

from hermes.run.export import split_gpt, tagged_blocks

MATCH, MISMATCH, GAP = 2, -1, -1
QUADRATIC_CELLS = 250_000  # beyond this many cells (500 x 500 steps), Python's quadratic table is too slow


def _canonical(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return " ".join(arguments.split())
    return arguments


def signature(step: dict) -> str:
    if step["tool_calls"]:
        calls = [[c.get("name"), _canonical(c.get("arguments"))] for c in step["tool_calls"]]
        return "calls:" + json.dumps(calls, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "text:" + " ".join(str(step["content"] or "").lower().split())


def steps(conversations: list[Any]) -> tuple[list[dict], list[dict]]:
    """(the turns before the first assistant turn: system and prompt, the steps)."""
    head: list[dict] = []
    out: list[dict] = []
    for t in conversations or []:
        if not isinstance(t, dict):
            continue
        who, value = t.get("from"), str(t.get("value") or "")
        if who == "gpt":
            reasoning, content, calls = split_gpt(value)
            out.append({"turn": len(out) + 1, "reasoning": reasoning, "content": content, "tool_calls": calls,
                        "results": []})
        elif who == "tool" and out:
            _, results = tagged_blocks(value, "tool_response")
            out[-1]["results"] += results or [{"name": "", "content": value}]
        elif out:  # a user turn after the agent started (a follow-up): a step of its own
            out.append({"turn": len(out) + 1, "reasoning": "", "content": f"[{who}] {value}", "tool_calls": [],
                        "results": []})
        else:
            head.append({"from": who, "content": value})
    for s in out:
        s["sig"] = signature(s)
    return head, out


def _pairwise(rows: list[set[str]], seq: list[str]) -> list[tuple[int | None, int | None]]:
    """Needleman–Wunsch between the rows so far (sets of signatures) and one column's signatures."""
    n, m = len(rows), len(seq)
    if n * m > QUADRATIC_CELLS:
        return _matching_blocks(rows, seq)
    score = [[0] * (m + 1) for _ in range(n + 1)]
    move = [[0] * (m + 1) for _ in range(n + 1)]  # 0 diagonal, 1 up (gap in the column), 2 left (new row)
    for i in range(1, n + 1):
        score[i][0], move[i][0] = i * GAP, 1
    for j in range(1, m + 1):
        score[0][j], move[0][j] = j * GAP, 2
    for i in range(1, n + 1):
        here, prev, row = score[i], score[i - 1], rows[i - 1]
        for j in range(1, m + 1):
            diag = prev[j - 1] + (MATCH if seq[j - 1] in row else MISMATCH)
            up, left = prev[j] + GAP, here[j - 1] + GAP
            best = max(diag, up, left)
            here[j] = best
            move[i][j] = 0 if best == diag else 1 if best == up else 2
    pairs: list[tuple[int | None, int | None]] = []
    i, j = n, m
    while i or j:
        mv = move[i][j]
        if mv == 0:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif mv == 1:
            pairs.append((i - 1, None))
            i -= 1
        else:
            pairs.append((None, j - 1))
            j -= 1
    return pairs[::-1]


def _matching_blocks(rows: list[set[str]], seq: list[str]) -> list[tuple[int | None, int | None]]:
    """Very long attempts: difflib's SequenceMatcher (Ratcliff-Obershelp, near linear here) against
    each row's first signature; a replaced stretch pairs step by step, its excess gets gap rows."""
    first = [min(r) if len(r) == 1 else sorted(r)[0] for r in rows]
    pairs: list[tuple[int | None, int | None]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, first, seq, autojunk=False).get_opcodes():
        common = min(i2 - i1, j2 - j1) if op in ("equal", "replace") else 0
        pairs += [(i1 + k, j1 + k) for k in range(common)]
        pairs += [(i, None) for i in range(i1 + common, i2)] + [(None, j) for j in range(j1 + common, j2)]
    return pairs


def align(columns: list[list[str]]) -> list[list[int | None]]:
    """Rows of step indexes, one per column (None: that column has no step on the row)."""
    if not columns:
        return []
    rows: list[list[int | None]] = [[k] for k in range(len(columns[0]))]
    sigs: list[set[str]] = [{s} for s in columns[0]]
    for c, seq in enumerate(columns[1:], 1):
        new_rows, new_sigs = [], []
        for r, k in _pairwise(sigs, seq):
            if r is None:
                new_rows.append([None] * c + [k])
                new_sigs.append({seq[k]})
                continue
            rows[r].append(k)
            if k is not None:
                sigs[r].add(seq[k])
            new_rows.append(rows[r])
            new_sigs.append(sigs[r])
        rows, sigs = new_rows, new_sigs
    return rows


def divergence(columns: list[list[str]], rows: list[list[int | None]]) -> tuple[int | None, list[int | None]]:
    """(the first row where the columns differ, each column's first row that differs from column 0)."""
    def sig(c: int, row: list[int | None]) -> str | None:
        return None if row[c] is None else columns[c][row[c]]

    first = next((i for i, row in enumerate(rows) if len({sig(c, row) for c in range(len(columns))}) > 1
                  or row[0] is None), None)
    per = [None] + [next((i for i, row in enumerate(rows) if sig(c, row) != sig(0, row)), None)
                    for c in range(1, len(columns))]
    return first, per
