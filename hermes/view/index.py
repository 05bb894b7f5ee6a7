"""The viewer's DuckDB index over a run's journal: one row per journal line, the columns its filters need.

Not the run's own index (hermes.data.run_index): a run in progress holds that file (DuckDB lets one
process open it), and it keeps only what planning and the merge need. This one is the run folder's
view.duckdb, derived like the other: rebuilt when missing, damaged or of another layout, and
brought up to date on every question by reading only the bytes appended since (the journal is
append-only; a file that shrank or went is indexed again). When another viewer holds the file,
the index lives in memory for this one.

Each line is decoded once, here; the list pages read only this table, and an entry's page reads
its one line from the batch file at the offset kept for it.
"""
from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import duckdb
import orjson

from hermes.data.dataset import split_attempt
from hermes.data.entry import Status
from hermes.data.failures import classify
from hermes.data.run_index import with_layout
from hermes.data.run_paths import RunPaths

log = logging.getLogger(__name__)

LAYOUT = 2  # 2: task, trial, stop_reason, reward (the tasks page and the compare view)
PROMPT_CHARS = 4000  # of the prompt kept for the list and its text search
_CHUNK = 5000
SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (pos BIGINT, batch_num INTEGER, line INTEGER, "offset" BIGINT, length INTEGER,
    prompt_index BIGINT, key VARCHAR, status VARCHAR, attempt INTEGER, error VARCHAR, reason VARCHAR,
    passed BOOLEAN, toolsets VARCHAR[], tools VARCHAR[], api_calls INTEGER, elapsed DOUBLE, prompt VARCHAR,
    task VARCHAR, trial INTEGER, stop_reason VARCHAR, reward DOUBLE);
CREATE TABLE IF NOT EXISTS tool_calls (pos BIGINT, tool VARCHAR, count INTEGER, failure INTEGER);
CREATE TABLE IF NOT EXISTS indexed_files (batch_num INTEGER PRIMARY KEY, size BIGINT, lines INTEGER);
CREATE TABLE IF NOT EXISTS layout (version INTEGER);
"""
_ENTRY_COLS = ("pos", "batch_num", "line", "offset", "length", "prompt_index", "key", "status", "attempt", "error",
               "reason", "passed", "toolsets", "tools", "api_calls", "elapsed", "prompt", "task", "trial", "stop_reason",
               "reward")
_TYPES = {"pos": "BIGINT", "batch_num": "INTEGER", "line": "INTEGER", "offset": "BIGINT", "length": "INTEGER",
          "prompt_index": "BIGINT", "attempt": "INTEGER", "passed": "BOOLEAN", "toolsets": "VARCHAR[]",
          "tools": "VARCHAR[]", "api_calls": "INTEGER", "elapsed": "DOUBLE", "trial": "INTEGER", "reward": "DOUBLE"}
_FAILED = f"'{Status.FAILED}'"
# the first successful line of each prompt, as the merge picks it (a line without a key is its own prompt)
WINNERS = f"""winners AS (SELECT min(pos) AS pos FROM entries WHERE status IS DISTINCT FROM {_FAILED}
                          GROUP BY coalesce(key, pos::VARCHAR))"""
NEVER_DONE = f"""never_done AS (SELECT coalesce(key, pos::VARCHAR) AS k, arg_max(reason, pos) AS reason,
                                       arg_max(error, pos) AS error FROM entries GROUP BY k
                                HAVING count(*) FILTER (WHERE status IS DISTINCT FROM {_FAILED}) = 0)"""


def _insert_sql(table: str, cols: tuple[str, ...]) -> str:
    shape = json.dumps({c: [_TYPES.get(c, "VARCHAR")] for c in cols})
    return (f"INSERT INTO {table} SELECT " + ", ".join(f'unnest(c."{col}")' for col in cols)
            + f" FROM (SELECT from_json(?, '{shape}') AS c)")


_INSERT_ENTRIES = _insert_sql("entries", _ENTRY_COLS)
_INSERT_TOOLS = _insert_sql("tool_calls", ("pos", "tool", "count", "failure"))


def row_of(raw: bytes) -> tuple[dict[str, Any], list[tuple[str, int, int]]] | None:
    """A journal line's columns and its tool calls ((tool, count, failed)); None: not a JSON object."""
    try:
        entry = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(entry, dict):
        return None
    meta = entry.get("hermes") if isinstance(entry.get("hermes"), dict) else {}
    reward = entry.get("reward") if isinstance(entry.get("reward"), dict) else None
    status = meta.get("status") or ("completed" if entry.get("completed") else "unknown")
    prompt = next((t.get("value") for t in entry.get("conversations") or []
                   if isinstance(t, dict) and t.get("from") == "human"), "") or ""
    stats = entry.get("tool_stats") if isinstance(entry.get("tool_stats"), dict) else {}
    calls = [(name, int(s.get("count", 0)), int(s.get("failure", 0))) for name, s in stats.items()
             if isinstance(s, dict) and s.get("count")]
    error = meta.get("error")
    index = entry.get("prompt_index")
    key = meta.get("key")
    value = reward.get("value") if reward is not None else None
    return {
        "prompt_index": index if isinstance(index, int) else None,
        "key": key, "status": str(status), "attempt": meta.get("attempt") or 1,
        "error": error, "reason": classify(error).kind if status == Status.FAILED else None,
        "passed": None if reward is None else bool(reward.get("passed")),
        "toolsets": [str(t) for t in entry.get("toolsets_used") or []],
        "tools": [name for name, _, _ in calls],
        "api_calls": entry.get("api_calls") if isinstance(entry.get("api_calls"), int) else None,
        "elapsed": meta.get("elapsed") if isinstance(meta.get("elapsed"), (int, float)) else None,
        "prompt": str(prompt)[:PROMPT_CHARS],
        # the task: a task folder's name, else the row's key without its attempt suffix (`<key>#a<n>`)
        "task": str(meta.get("task") or (split_attempt(str(key))[0] if key else "")) or None,
        "trial": meta.get("trial") if isinstance(meta.get("trial"), int) else 1,
        "stop_reason": meta.get("stop_reason") if isinstance(meta.get("stop_reason"), str) else None,
        "reward": (float(value) if isinstance(value, (int, float)) and not isinstance(value, bool)
                   else None if reward is None else float(bool(reward.get("passed")))),
    }, calls


class ViewIndex:
    def __init__(self, run_dir: Path, database: str | None = None):
        self.run_dir = Path(run_dir)
        self.paths = RunPaths(self.run_dir)
        self.lock = threading.Lock()  # one DuckDB connection, shared by the server's threads
        self.generation = 0  # counts refreshes that changed the table (derived tables rebuild on a change)
        self.con = self._connect(database)

    def _connect(self, database: str | None) -> duckdb.DuckDBPyConnection:
        if database is None:
            try:
                return _with_layout(duckdb.connect(str(self.paths.view_index)))
            except duckdb.IOException as e:
                if "lock" in str(e).lower() or "read-only" in str(e).lower() or "permission" in str(e).lower():
                    log.info("viewer index %s not writable here (%s): keeping it in memory", self.paths.view_index, e)
                    return _with_layout(duckdb.connect(":memory:"))
                damaged: Exception = e
            except duckdb.Error as e:
                damaged = e
            log.warning("viewer index %s is unreadable (%s); rebuilding it", self.paths.view_index, damaged)
            for p in (self.paths.view_index, self.paths.view_index.with_name(self.paths.view_index.name + ".wal")):
                p.unlink(missing_ok=True)
            return _with_layout(duckdb.connect(str(self.paths.view_index)))
        return _with_layout(duckdb.connect(database))

    def refresh(self) -> None:
        """Index what was appended to the batch files since the last refresh."""
        with self.lock:
            known = {n: (size, lines) for n, size, lines in
                     self.con.execute("SELECT batch_num, size, lines FROM indexed_files").fetchall()}
            on_disk = {n: p for n, p in self.paths.batch_files()}
            redo = {n for n in known if n not in on_disk}
            todo = []
            for n, path in on_disk.items():
                size = path.stat().st_size
                start, lines = known.get(n, (0, 0))
                if size < start:  # rewritten: index it again from the start
                    redo.add(n)
                    start, lines = 0, 0
                if size != start:
                    todo.append((n, path, start, lines))
            if not (redo or todo):
                return
            self.con.execute("BEGIN")
            try:
                if redo:
                    gone = sorted(redo)
                    self.con.execute("DELETE FROM tool_calls WHERE list_contains(?, (pos >> 32)::INTEGER)", [gone])
                    self.con.execute("DELETE FROM entries WHERE list_contains(?, batch_num)", [gone])
                    self.con.execute("DELETE FROM indexed_files WHERE list_contains(?, batch_num)", [gone])
                for n, path, start, lines in todo:
                    self._index_file(n, path, start, lines)
                self.con.execute("COMMIT")
                self.generation += 1
            except BaseException:
                self.con.execute("ROLLBACK")
                raise

    def _index_file(self, num: int, path: Path, start: int, line: int) -> None:
        rows: dict[str, list] = {c: [] for c in _ENTRY_COLS}
        tools: dict[str, list] = {"pos": [], "tool": [], "count": [], "failure": []}
        offset = start
        with open(path, "rb", buffering=1 << 20) as f:
            f.seek(start)
            for raw in f:
                if not raw.endswith(b"\n"):
                    break  # a line still being written (or torn): the next refresh takes it
                parsed = row_of(raw)
                if parsed is not None:
                    cols, calls = parsed
                    pos = num << 32 | line
                    cols["task"] = cols["task"] or f"line {pos}"  # no key: the line is a task of its own
                    for key, value in {**cols, "pos": pos, "batch_num": num, "line": line, "offset": offset,
                                       "length": len(raw)}.items():
                        rows[key].append(value)
                    for name, count, failure in calls:
                        for key, value in (("pos", pos), ("tool", name), ("count", count), ("failure", failure)):
                            tools[key].append(value)
                offset += len(raw)
                line += 1
                if len(rows["pos"]) >= _CHUNK:
                    self._insert(rows, tools)
                    rows, tools = {c: [] for c in rows}, {c: [] for c in tools}
        self._insert(rows, tools)
        self.con.execute("INSERT OR REPLACE INTO indexed_files VALUES (?, ?, ?)", [num, offset, line])

    def _insert(self, rows: dict[str, list], tools: dict[str, list]) -> None:
        if rows["pos"]:
            self.con.execute(_INSERT_ENTRIES, [json.dumps(rows)])
        if tools["pos"]:
            self.con.execute(_INSERT_TOOLS, [json.dumps(tools)])

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        with self.lock:
            return self.con.execute(sql, params or []).fetchall()

    def arrow(self, sql: str, params: list | None = None):
        """A query's rows as an Arrow table (for joining two runs' per-task rows in another DuckDB)."""
        with self.lock:
            rel = self.con.sql(sql, params=params or None)  # a relation: Arrow without an extra copy
            return (getattr(rel, "to_arrow_table", None) or rel.arrow)()  # DuckDB 2 names it to_arrow_table

    def read_line(self, batch_num: int, offset: int, length: int) -> dict[str, Any]:
        with open(self.paths.batch(batch_num), "rb") as f:
            f.seek(offset)
            return orjson.loads(f.read(length))

    def close(self) -> None:
        with self.lock:
            self.con.close()


def _with_layout(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    return with_layout(con, SCHEMA, LAYOUT, ("entries", "tool_calls", "indexed_files"))
