"""The run's DuckDB index over its journal (the batch files).

Only the flow process opens this file (DuckDB allows one writer per file). It is derived:
when it is missing, damaged or behind the batch files, it is rebuilt from them.
"""
from __future__ import annotations

import logging
from pathlib import Path

import duckdb

from hermes import journal

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS outcomes (
    batch_num INTEGER, prompt_index BIGINT, key VARCHAR, status VARCHAR, error VARCHAR);
CREATE TABLE IF NOT EXISTS indexed_files (batch_num INTEGER PRIMARY KEY, size BIGINT);
"""
COLUMNS = {"prompt_index": "BIGINT", "hermes": "STRUCT(key VARCHAR, status VARCHAR, error VARCHAR)"}


class RunIndex:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.path = run_dir / "index.duckdb"
        self.con = self._connect()
        self.refresh()

    def _connect(self) -> duckdb.DuckDBPyConnection:
        try:
            con = duckdb.connect(str(self.path))
            con.execute(SCHEMA)
            return con
        except duckdb.Error as e:
            # Derived data: a damaged index is set aside and rebuilt from the journal.
            log.warning("run index %s is unreadable (%s); rebuilding it from the batch files", self.path, e)
            for p in (self.path, self.path.with_name(self.path.name + ".wal")):
                if p.exists():
                    p.replace(p.with_name(p.name + ".damaged"))
            con = duckdb.connect(str(self.path))
            con.execute(SCHEMA)
            return con

    def refresh(self) -> None:
        """Index every batch file that changed since it was last indexed."""
        known = dict(self.con.execute("SELECT batch_num, size FROM indexed_files").fetchall())
        for num, path in journal.batch_files(self.run_dir):
            size = path.stat().st_size
            if known.get(num) != size:
                self.index_batch(num, path, size)

    def index_batch(self, batch_num: int, path: Path, size: int | None = None) -> None:
        size = path.stat().st_size if size is None else size
        self.con.execute("BEGIN")
        self.con.execute("DELETE FROM outcomes WHERE batch_num = ?", [batch_num])
        self.con.execute(
            """INSERT INTO outcomes
               SELECT ?, prompt_index, hermes.key, hermes.status, hermes.error
               FROM read_json(?, format='newline_delimited', columns=?, ignore_errors=true)
               WHERE hermes.key IS NOT NULL""",
            [batch_num, str(path), COLUMNS],
        )
        self.con.execute("INSERT OR REPLACE INTO indexed_files VALUES (?, ?)", [batch_num, size])
        self.con.execute("COMMIT")

    def done_keys(self, batch_num: int | None = None) -> set[str]:
        """Keys with a successful outcome (in one batch, or in all); failed prompts are owed again."""
        where = "status <> 'failed'" + ("" if batch_num is None else " AND batch_num = ?")
        params = [] if batch_num is None else [batch_num]
        return {k for (k,) in self.con.execute(f"SELECT DISTINCT key FROM outcomes WHERE {where}", params).fetchall()}

    def failed_attempts(self) -> dict[str, int]:
        """Failed attempts of each prompt that has not succeeded yet."""
        return dict(self.con.execute(
            """SELECT key, count(*) FROM outcomes GROUP BY key
               HAVING count(*) FILTER (WHERE status <> 'failed') = 0""").fetchall())

    def next_batch_num(self) -> int:
        nums = [n for n, _ in journal.batch_files(self.run_dir)]
        return max(nums) + 1 if nums else 0

    def batch_stats(self) -> dict[str, dict[str, int]]:
        rows = self.con.execute(
            """SELECT batch_num, count(*),
                      count(*) FILTER (WHERE status = 'failed'),
                      count(*) FILTER (WHERE status = 'discarded')
               FROM outcomes GROUP BY batch_num ORDER BY batch_num"""
        ).fetchall()
        return {str(b): {"processed": n, "skipped": f, "discarded_no_reasoning": d} for b, n, f, d in rows}

    def close(self) -> None:
        self.con.close()
