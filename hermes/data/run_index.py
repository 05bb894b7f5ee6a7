"""The run's DuckDB index over its journal (the batch files), and the dataset's keys beside it.

Only the flow process opens this file (DuckDB allows one writer per file). It is derived:
when it is missing, damaged, of an older layout or behind the batch files, it is rebuilt from them.

Journal lines are read here in Python rather than by DuckDB's read_json, so that every line keeps
its line number and the index, planning and the merge all read the journal with one parser: the
merge asks the index which line wins for each key and streams exactly those lines.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterator

import duckdb

from hermes.errors import HermesError
from hermes.data import bitmap, journal
from hermes.data.run_paths import RunPaths
from hermes.data.entry import Status
from hermes.data.journal_lines import journal_lines, outcome_block, verdict

log = logging.getLogger(__name__)
#: the statuses as SQL literals (hermes.data.entry.Status is the one list of them)
_FAILED, _DISCARDED = f"'{Status.FAILED}'", f"'{Status.DISCARDED}'"
_STOPPED = f"'{Status.STOPPED}'"

LAYOUT = 4  # bump when the tables change: an index of another layout is rebuilt from the journal
# No PRIMARY KEY on indexed_files: its ART index, upserted once a landing, kept native memory that
# grew with every batch of a run (bench/INFLIGHT_MEMORY.md, fourth pass); a file's row is deleted
# and inserted in the transaction that drops its old outcomes instead.
SCHEMA = """
CREATE TABLE IF NOT EXISTS outcomes (batch_num INTEGER, line INTEGER, key VARCHAR, status VARCHAR, error VARCHAR,
                                     passed BOOLEAN);
CREATE TABLE IF NOT EXISTS indexed_files (batch_num INTEGER, size BIGINT);
CREATE TABLE IF NOT EXISTS layout (version INTEGER);
"""
# read_json columns of a journal line, for readers that scan the batch files themselves (hermes.run.status)
COLUMNS = {"prompt_index": "BIGINT", "hermes": "STRUCT(key VARCHAR, status VARCHAR, error VARCHAR)"}

# DuckDB turns Python lists into columns slowly; one JSON document of columns per chunk is ~2x faster.
_CHUNK = 10_000
# 24 MB: a 200,000-trajectory merge peaked at 125 MiB, against 130 at 32 MB and 135 at 16 MB (where the
# spilling costs more than it saves; bench/INFLIGHT_MEMORY.md, fifth pass)
LEAN_MEMORY = "24MB"
#: a live run's index: its dataset's keys and the outcomes landed spill to disk beyond this, so a
#: run of 200,000 prompts holds less than at 32 MB (bench/INFLIGHT_MEMORY.md, fifth pass)
RUN_MEMORY = "16MB"
# A lean index checkpoints its write-ahead log at this size rather than DuckDB's 16 MiB: until a
# checkpoint, every small commit of a live run's landings keeps native memory outside the memory
# limit (a run's index grew +29 MiB over 200,000 lines at the default, +12 MiB at 1 MB).
LEAN_CHECKPOINT = "1MB"
#: owed (index, key) pairs read off the index at a time while a plan is handed out
OWED_CHUNK = 8192
_INSERT = """INSERT INTO outcomes
    SELECT unnest(c.batch_num), unnest(c.line), unnest(c.key), unnest(c.status), unnest(c.error), unnest(c.passed)
    FROM (SELECT from_json(?, '{"batch_num": ["INTEGER"], "line": ["INTEGER"], "key": ["VARCHAR"],
                                "status": ["VARCHAR"], "error": ["VARCHAR"], "passed": ["BOOLEAN"]}') AS c)"""


class IndexBusy(HermesError, RuntimeError):
    """Another process (an active run) holds the run's index file."""

    transient = True


def _text(value) -> str | None:
    return value if value is None or isinstance(value, str) else json.dumps(value)


# --------------------------------------------------------------------------- the index


class RunIndex:
    def __init__(self, run_dir: Path, database: str | None = None, lean: bool = False, memory: str = LEAN_MEMORY):
        """database: the run's index file by default; ":memory:" for a private, throw-away index.

        lean: cap DuckDB at `memory` and one thread (it spills to disk beyond), so that a pass
        over the whole journal (the merge) keeps the same peak however long the run.
        """
        self.run_dir = run_dir
        self.path = RunPaths(run_dir).index if database is None else Path(database)
        self.con = self._connect(str(self.path) if database is None else database)
        if lean:
            self.con.execute(f"SET memory_limit = '{memory}'; SET threads = 1; "
                             f"SET checkpoint_threshold = '{LEAN_CHECKPOINT}'")
        self.refresh()

    def _connect(self, database: str) -> duckdb.DuckDBPyConnection:
        try:
            con = duckdb.connect(database)
            return _with_layout(con)
        except duckdb.IOException as e:
            if "lock" in str(e).lower():
                raise IndexBusy(f"run index {self.path} is held by another process: {e}") from None
            damaged = e
        except duckdb.Error as e:
            damaged = e
        # Derived data: a damaged index is set aside and rebuilt from the journal.
        log.warning("run index %s is unreadable (%s); rebuilding it from the batch files", self.path, damaged)
        for p in (self.path, self.path.with_name(self.path.name + ".wal")):
            if p.exists():
                p.replace(p.with_name(p.name + ".damaged"))
        return _with_layout(duckdb.connect(database))

    def refresh(self) -> None:
        """Index every batch file that changed since it was last indexed; forget files that are gone."""
        known = dict(self.con.execute("SELECT batch_num, size FROM indexed_files").fetchall())
        paths = RunPaths(self.run_dir)
        try:
            on_disk = paths.batch_sizes()
        except FileNotFoundError:
            on_disk = {}
        gone = known.keys() - on_disk.keys()
        changed = [(num, paths.batch(num), size) for num, size in sorted(on_disk.items()) if known.get(num) != size]
        if gone or changed:
            self._index(changed, stale=gone | {num for num, _, _ in changed if num in known})

    def index_batches(self, files: list[tuple[int, Path]]) -> list[str]:
        """Index these batch files as they are now, in one go (each statement costs a millisecond
        or more); the keys their lines finish (a success: any status but failed)."""
        return self._index([(num, path, path.stat().st_size) for num, path in files], stale={num for num, _ in files})

    def _index(self, files: list[tuple[int, Path, int]], stale: set[int]) -> list[str]:
        """(Re)index files, in transactions of about _CHUNK lines (DuckDB holds uncommitted rows in memory).

        `stale` names the files already indexed (gone ones among them): their rows go first. If this
        is cut short, a file whose rows are gone is no longer listed as indexed, so the next refresh
        indexes it again.
        """
        self.con.execute("BEGIN")
        try:
            if stale:  # one pass over each table, not one per file
                self.con.execute("DELETE FROM outcomes WHERE list_contains(?, batch_num)", [sorted(stale)])
                self.con.execute("DELETE FROM indexed_files WHERE list_contains(?, batch_num)", [sorted(stale)])
            cols, done = _columns(), []
            for num, path, size in files:
                for line, raw in journal_lines(path, size):
                    meta = outcome_block(raw)
                    if meta is not None:
                        key, status = _text(meta.get("key")), _text(meta.get("status"))
                        if key is not None and status != Status.FAILED:
                            done.append(key)
                        cols["batch_num"].append(num)
                        cols["line"].append(line)
                        cols["key"].append(key)
                        cols["status"].append(status)
                        cols["error"].append(_text(meta.get("error")))
                        cols["passed"].append(verdict(raw))  # the check's verdict: attempt policies read it
                cols["files"].append((num, size))
                if len(cols["line"]) >= _CHUNK:  # whole files per transaction: the index never holds half a file
                    self._insert(cols)
                    cols = _columns()
                    self.con.execute("COMMIT")
                    self.con.execute("BEGIN")
            self._insert(cols)
            self.con.execute("COMMIT")
            return done
        except BaseException:
            self.con.execute("ROLLBACK")
            raise

    def _insert(self, cols: dict[str, list]) -> None:
        files = cols.pop("files")
        if cols["line"]:
            self.con.execute(_INSERT, [json.dumps(cols)])
        if files:  # one statement: each costs a millisecond or more
            nums, sizes = zip(*files)
            self.con.execute("INSERT INTO indexed_files SELECT unnest(?), unnest(?)", [list(nums), list(sizes)])

    # ----------------------------------------------------------------------- planning

    def done_keys(self, batch_num: int | None = None) -> set[str]:
        """Keys with a successful outcome (in one batch, or in all); failed prompts are owed again."""
        where = f"status <> {_FAILED} AND key IS NOT NULL" + ("" if batch_num is None else " AND batch_num = ?")
        params = [] if batch_num is None else [batch_num]
        return {k for (k,) in self.con.execute(f"SELECT DISTINCT key FROM outcomes WHERE {where}", params).fetchall()}

    def failed_attempts(self) -> dict[str, int]:
        """Failed attempts of each prompt that has not succeeded yet."""
        return dict(self.con.execute(
            f"""SELECT key, count(*) FROM outcomes WHERE key IS NOT NULL GROUP BY key
                HAVING count(*) FILTER (WHERE status <> {_FAILED}) = 0""").fetchall())

    def load_dataset(self, dataset) -> None:
        """Put the dataset's content keys beside the journal, so planning is a join (see load_dataset)."""
        load_dataset(self.con, dataset)

    def owed(self, max_attempts: int | None = None) -> list[tuple[int, str]]:
        """(row index, key) of the dataset's rows still owed, in dataset order: no success yet and,
        with max_attempts, fewer attempts than that."""
        return self.owed_slice(0, self.plan_owed(max_attempts))

    def plan_owed(self, max_attempts: int | None = None) -> int:
        """Number the rows still owed (as owed() orders them) in a table of the index; how many.
        A run's plan reads them back a slice at a time (owed_slice), so it never holds a pair per
        prompt of the dataset. The table holds a position and the dataset row's id, not its key:
        the dataset's rows go in by row then attempt (load_dataset), so id order is attempt order."""
        self._execute(self.con, "CREATE OR REPLACE TEMP TABLE owed_plan AS " + _TRIED + """,
            o AS (SELECT d.idx, d.rowid AS rid FROM dataset d LEFT JOIN tried t USING (key)
                  WHERE coalesce(t.ok, 0) = 0 AND coalesce(t.attempts, 0) < ?)
            SELECT row_number() OVER (ORDER BY idx, rid) - 1 AS pos, rid FROM o""",
                      [max_attempts or 2 ** 62])
        return self.con.execute("SELECT count(*) FROM owed_plan").fetchone()[0]

    def owed_slice(self, start: int, stop: int) -> list[tuple[int, str]]:
        """(row index, key) of the owed rows numbered start to stop - 1 by the last plan_owed."""
        return self.con.execute("""SELECT d.idx, d.key FROM owed_plan p JOIN dataset d ON d.rowid = p.rid
                                   WHERE p.pos >= ? AND p.pos < ? ORDER BY p.pos""", [start, stop]).fetchall()

    def given_up(self, max_attempts: int) -> int:
        """How many prompts of the journal failed max_attempts times and never succeeded."""
        return self.con.execute(_TRIED + "SELECT count(*) FROM tried WHERE ok = 0 AND attempts >= ?",
                                [max_attempts]).fetchone()[0]

    def completed_bitmap(self, rows: int) -> bytearray:
        """The dataset rows done (any attempt a success), one bit a row (hermes.data.bitmap).

        A run builds it once and adds its landings' keys (index_batches) for checkpoint.json:
        joining the journal's keys with the dataset's every few seconds held 25 MiB more at
        200,000 prompts (bench/INFLIGHT_MEMORY.md, fifth pass).
        """
        bits = bitmap.empty(rows)
        self._execute(self.con, f"""SELECT DISTINCT idx FROM dataset
                                    SEMI JOIN (SELECT key FROM outcomes WHERE status <> {_FAILED}) USING (key)""")
        while chunk := self.con.fetchmany(OWED_CHUNK):
            bitmap.add(bits, (i for (i,) in chunk))
        return bits

    def next_batch_num(self) -> int:
        nums = [n for n, _ in journal.batch_files(self.run_dir)]
        return max(nums) + 1 if nums else 0

    def batch_stats(self, size: int = 8192) -> Iterator[list[tuple[int, int, int, int]]]:
        """(batch number, prompts, failed, discarded) of every batch, in order, a chunk at a time."""
        self.con.execute(
            f"""SELECT batch_num, count(*),
                      count(*) FILTER (WHERE status = {_FAILED}),
                      count(*) FILTER (WHERE status = {_DISCARDED})
               FROM outcomes WHERE key IS NOT NULL GROUP BY batch_num ORDER BY batch_num""")
        while chunk := self.con.fetchmany(size):
            yield chunk

    # ----------------------------------------------------------------------- merging

    def batch_count(self) -> int:
        return self.con.execute("SELECT count(*) FROM indexed_files").fetchone()[0]

    def winning_files(self) -> Iterator[tuple[int, Path, int, set[int]]]:
        """(batch number, path, indexed size, its winning lines) of every indexed batch file, in
        batch order: a key's winner is its first successful line in journal order (a line without
        a key counts as the key NULL, as the merge always did).

        Streamed from two cursors walked side by side (the files, and the winners' journal
        positions in order), so a merge holds one file's winners at a time: a list of every file
        and a bitmap per file held 16 MB at 200,000 trajectories (bench/INFLIGHT_MEMORY.md,
        fifth pass). DuckDB's side is bounded by its memory limit (a lean index spills to disk).
        """
        paths = RunPaths(self.run_dir)
        files, wins = self.con.cursor(), self.con.cursor()
        try:
            files.execute("SELECT batch_num, size FROM indexed_files ORDER BY batch_num")
            self._execute(wins, f"""SELECT min({_POS}) AS pos FROM outcomes
                                    WHERE status IS DISTINCT FROM {_FAILED} GROUP BY key ORDER BY pos""")
            ahead = _rows(wins)
            pos = next(ahead, None)
            for chunk in iter(lambda: files.fetchmany(1024), []):
                for num, size in chunk:
                    lines = set()
                    while pos is not None and pos >> 32 <= num:
                        if pos >> 32 == num:
                            lines.add(pos & 0xFFFFFFFF)
                        pos = next(ahead, None)
                    yield num, paths.batch(num), size, lines
        finally:
            files.close()
            wins.close()

    def prompt_count(self) -> int:
        """Distinct keys in the journal, NULL counted as one (a run folder without run.json counts its prompts so)."""
        return self.con.execute(
            "SELECT count(DISTINCT key) + coalesce(max((key IS NULL)::INT), 0) FROM outcomes").fetchone()[0]

    def final_errors(self) -> list[str | None]:
        """The LAST error of each prompt that failed and never succeeded, in order of first failure
        in the journal (hermes.data.failures groups them by kind)."""
        return [e for (e,) in self._execute(self.con, f"""
            WITH failed AS (
                SELECT key, min({_POS}) AS first, arg_max(error, {_POS}) AS last_error
                FROM outcomes WHERE status = {_FAILED} GROUP BY key)
            SELECT last_error FROM failed f
            WHERE NOT EXISTS (SELECT 1 FROM outcomes o
                              WHERE o.key IS NOT DISTINCT FROM f.key AND o.status IS DISTINCT FROM {_FAILED})
            ORDER BY first""").fetchall()]

    def retried_attempts(self) -> list[tuple[str, str | None, bool]]:
        """(key, error, whether the prompt succeeded in the end) of each failed attempt that was
        tried again (in the run, or on a later --resume), in journal order."""
        return self._execute(self.con, f"""
            WITH a AS (
                SELECT key, status, error, {_POS} AS pos,
                       count(*) OVER (PARTITION BY key ORDER BY {_POS}
                                      ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS later,
                       count(*) FILTER (WHERE status IS DISTINCT FROM {_FAILED}) OVER (PARTITION BY key) AS ok
                FROM outcomes WHERE key IS NOT NULL)
            SELECT key, error, ok > 0 FROM a WHERE status = {_FAILED} AND later > 0 ORDER BY pos""").fetchall()

    def query(self, sql: str, params: list | dict | None = None, limit: int | None = None) -> list[tuple]:
        """Rows of a query over the index's tables (dataset, outcomes, and a caller's temp tables);
        with `limit`, only the first that many are fetched."""
        # on the connection itself: a cursor is another connection, blind to this one's temp tables
        cur = self._execute(self.con, sql, params)
        return cur.fetchall() if limit is None else cur.fetchmany(limit)

    def _execute(self, cur, sql: str, params: list | dict | None = None):
        try:
            return cur.execute(sql, params)
        except duckdb.OutOfMemoryException:
            # The lean cap was too tight for this journal: finish slower and bigger rather than fail.
            log.warning("run index %s: a query needs more than its memory cap, lifting the limit", self.path)
            self.con.execute("RESET memory_limit")
            return cur.execute(sql, params)

    def close(self) -> None:
        self.con.close()


_POS = "(batch_num::BIGINT << 32 | line)"  # a line's place in the journal, as one number
_TRIED = f"""WITH tried AS (SELECT key, count(*) FILTER (WHERE status <> {_FAILED}) AS ok, count(*) AS attempts
                            FROM outcomes WHERE key IS NOT NULL GROUP BY key) """


def _rows(cur) -> Iterator[int]:
    """The first column of a query's rows, fetched 10,000 at a time."""
    while chunk := cur.fetchmany(10_000):
        for (value,) in chunk:
            yield value


def _columns() -> dict[str, list]:
    return {"batch_num": [], "line": [], "key": [], "status": [], "error": [], "passed": [], "files": []}


def _with_layout(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    return with_layout(con, SCHEMA, LAYOUT, ("outcomes", "indexed_files"))


def with_layout(con: duckdb.DuckDBPyConnection, schema: str, layout: int, tables: tuple[str, ...]) -> duckdb.DuckDBPyConnection:
    """Create a derived index's tables (`schema`, with a `layout` table of versions), or rebuild
    them when another version of its module made them: the journal can always fill them again."""
    con.execute(schema)
    if con.execute("SELECT max(version) FROM layout").fetchone()[0] != layout:
        con.execute("; ".join(f"DROP TABLE {t}" for t in (*tables, "layout")))
        con.execute(schema)
        con.execute("INSERT INTO layout VALUES (?)", [layout])
    return con


def load_dataset(con: duckdb.DuckDBPyConnection, dataset) -> None:
    """A temporary table dataset(idx, key): each row's content key, `<hash>-<occurrence>`.

    The occurrence numbers identical rows in dataset order (hermes.data.dataset.Dataset.keys counts
    them the same way in Python). Hashes cross into DuckDB as comma-separated text, which it
    splits far faster than it converts Python lists, 20,000 at a time: a chunk's text and its
    split list are what the load holds beyond the table (100,000 a chunk peaked 16 MiB higher at
    200,000 rows). One table, filled in place: a second copy of the keys (hashes, then keys) cost
    a 200,000-row run 20 MiB at its start.
    """
    con.execute("CREATE OR REPLACE TEMP TABLE dataset (idx BIGINT, key VARCHAR)")
    for start, text in dataset.hash_chunks(20_000):
        con.execute("""INSERT INTO dataset
                       SELECT ? + generate_subscripts(hs, 1) - 1, unnest(hs) || '-0' FROM (SELECT string_split(?, ',') AS hs)""",
                    [start, text])
    # Occurrences are numbered only among the keys that repeat, found by a 64-bit hash first: a
    # grouping or window over every row's key text does not fit the lean index's cap at a million rows.
    con.execute("""UPDATE dataset SET key = left(dataset.key, -1) || occ.n FROM (
                       SELECT idx, row_number() OVER (PARTITION BY key ORDER BY idx) - 1 AS n FROM dataset
                       WHERE hash(key) IN (SELECT hash(key) AS h FROM dataset GROUP BY h HAVING count(*) > 1)) occ
                   WHERE dataset.idx = occ.idx AND occ.n > 0""")
    # --attempts K: attempt n of a row is a prompt of its own, keyed `<key>#a<n>` from the second on
    # (hermes.data.dataset.attempt_key). They go in after every first attempt, in attempt order, so
    # that ordering by (idx, rowid) is by row then attempt (RunIndex.plan_owed).
    for a in range(2, int(getattr(dataset, "attempts", 1) or 1) + 1):
        con.execute("INSERT INTO dataset SELECT idx, key || '#a' || ? FROM dataset WHERE NOT contains(key, '#')", [a])
