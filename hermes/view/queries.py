"""What the viewer's pages ask of its index: the run's summary, a page of entries, one entry.

Prompts are counted as the merge counts them (the first successful line of a prompt wins; a prompt
that never succeeded is failed, with its last error's kind); the list shows every journal line
(each attempt), so failed attempts can be looked at too.
"""
from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, Field

from hermes.run import rundir
from hermes.run.export import split_gpt, tagged_blocks
from hermes.view.index import NEVER_DONE, WINNERS, ViewIndex

PAGE_SIZE = 50
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp")
_IMAGE_PATH = re.compile(r"images/[\w.\-]+\.(?:png|jpe?g|gif|webp)")


class Filters(BaseModel):
    """The list's filters, from the page's query string."""

    status: str | None = None
    reward: str | None = Field(None, pattern="^(passed|failed|unchecked)$")
    toolset: str | None = None
    tool: str | None = None
    reason: str | None = None
    q: str | None = None
    page: int = Field(1, ge=1)
    size: int = Field(PAGE_SIZE, ge=1, le=500)

    def where(self) -> tuple[str, list]:
        clauses, params = [], []
        if self.status:
            clauses.append("status = ?")
            params.append(self.status)
        if self.reward == "passed":
            clauses.append("passed")
        elif self.reward == "failed":
            clauses.append("NOT passed")
        elif self.reward == "unchecked":
            clauses.append("passed IS NULL")
        if self.toolset:
            clauses.append("list_contains(toolsets, ?)")
            params.append(self.toolset)
        if self.tool:
            clauses.append("list_contains(tools, ?)")
            params.append(self.tool)
        if self.reason:
            clauses.append("reason = ?")
            params.append(self.reason)
        if self.q and self.q.strip():
            clauses.append("(contains(lower(prompt), ?) OR contains(lower(coalesce(error, '')), ?))")
            params += [self.q.strip().lower()] * 2
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def summary(index: ViewIndex) -> dict[str, Any]:
    index.refresh()
    manifest = rundir.read_manifest(index.run_dir)
    (lines, prompts), = index.query("SELECT count(*), count(DISTINCT coalesce(key, pos::VARCHAR)) FROM entries")
    won = dict(index.query(f"WITH {WINNERS} SELECT e.status, count(*) FROM winners JOIN entries e USING (pos) GROUP BY 1"))
    (checked, passed), = index.query(
        f"WITH {WINNERS} SELECT count(e.passed), count(*) FILTER (WHERE e.passed) FROM winners JOIN entries e USING (pos)")
    tools = index.query(f"""WITH {WINNERS} SELECT t.tool, sum(t.count)::BIGINT, sum(t.failure)::BIGINT
                            FROM winners JOIN tool_calls t USING (pos) GROUP BY 1 HAVING sum(t.count) > 0
                            ORDER BY 2 DESC, 1""")
    reasons = index.query(f"""WITH {NEVER_DONE} SELECT coalesce(reason, 'unknown error'), count(*), any_value(error)
                              FROM never_done GROUP BY 1 ORDER BY 2 DESC, 1""")
    statuses = index.query("SELECT status, count(*) FROM entries GROUP BY 1 ORDER BY 2 DESC")
    toolsets = [t for (t,) in index.query("SELECT DISTINCT unnest(toolsets) AS t FROM entries ORDER BY t")]
    failed = sum(count for _, count, _ in reasons)
    return {
        "run_name": manifest.get("run_name", index.run_dir.name),
        "model": manifest.get("model"), "distribution": manifest.get("distribution"),
        "total_prompts": manifest.get("total_prompts", prompts),
        "prompts_seen": prompts, "lines": lines,
        "done": won.get("completed", 0) + won.get("partial", 0), "partial": won.get("partial", 0),
        "discarded": won.get("discarded", 0), "failed": failed,
        "checks": {"checked": checked, "passed": passed,
                   "pass_rate": round(passed / checked * 100, 1) if checked else None},
        "tools": [{"tool": t, "count": c, "failure": f} for t, c, f in tools],
        "failure_reasons": [{"reason": r, "count": c, "example": (e or "")[:300]} for r, c, e in reasons],
        "statuses": [{"status": s, "count": c} for s, c in statuses],
        "toolsets": toolsets,
    }


def entries(index: ViewIndex, filters: Filters) -> dict[str, Any]:
    index.refresh()
    where, params = filters.where()
    (total,), = index.query(f"SELECT count(*) FROM entries{where}", params)
    rows = index.query(
        f"""SELECT prompt_index, pos, status, attempt, passed, toolsets, tools, api_calls, elapsed,
                   left(prompt, 200), reason, task, trial FROM entries{where} ORDER BY pos LIMIT ? OFFSET ?""",
        params + [filters.size, (filters.page - 1) * filters.size])
    keys = ("prompt_index", "pos", "status", "attempt", "passed", "toolsets", "tools", "api_calls", "elapsed",
            "prompt", "reason", "task", "trial")
    return {"total": total, "page": filters.page, "size": filters.size,
            "entries": [dict(zip(keys, r)) for r in rows]}


def entry(index: ViewIndex, prompt_index: int, pos: int | None = None) -> dict[str, Any] | None:
    """One prompt's line (the winning one, else its latest attempt, or the one `pos` names), with its
    conversation taken apart for display and its attempts listed."""
    index.refresh()
    attempts = index.query("""SELECT pos, status, attempt, batch_num, "offset", length, task FROM entries
                              WHERE prompt_index = ? ORDER BY pos""", [prompt_index])
    if not attempts:
        return None
    chosen = next((a for a in attempts if a[0] == pos), None) if pos is not None else None
    chosen = chosen or next((a for a in attempts if a[1] != "failed"), attempts[-1])
    line = index.read_line(chosen[3], chosen[4], chosen[5])
    meta = line.get("hermes") if isinstance(line.get("hermes"), dict) else {}
    files = [f for f in meta.get("files") or [] if isinstance(f, str)]
    return {
        "prompt_index": prompt_index, "pos": chosen[0], "task": chosen[6],
        "attempts": [{"pos": a[0], "status": a[1], "attempt": a[2]} for a in attempts],
        "turns": [_turn(t, files) for t in line.get("conversations") or [] if isinstance(t, dict)],
        "reward": line.get("reward"),
        "metadata": line.get("metadata"),
        "hermes": {k: v for k, v in meta.items() if k != "files"},
        "fields": {k: line.get(k) for k in ("completed", "partial", "api_calls", "toolsets_used")},
        "images": [f for f in files if f.lower().endswith(IMAGE_SUFFIXES)],
    }


def _turn(turn: dict, files: list[str]) -> dict[str, Any]:
    who, value = turn.get("from"), str(turn.get("value") or "")
    if who == "gpt":
        reasoning, content, calls = split_gpt(value)
        return {"from": who, "reasoning": reasoning, "content": content, "tool_calls": calls}
    if who == "tool":
        _, results = tagged_blocks(value, "tool_response")
        if results:
            return {"from": who, "results": [{**r, "images": _images_in(r, files)} for r in results]}
    return {"from": who, "content": value}


def _images_in(result: dict, files: list[str]) -> list[str]:
    """Images of the run folder a tool result names (an image_generate result, a browser_vision shot)."""
    text = json.dumps(result.get("content"), ensure_ascii=False)
    return sorted({m for m in _IMAGE_PATH.findall(text)} & set(files)) or sorted(set(_IMAGE_PATH.findall(text)))
