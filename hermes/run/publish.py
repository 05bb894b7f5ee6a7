"""Publishing a run's final entries as Parquet shards while it goes: exactly once, across kills.

The journal (the batch files) is the source, as for the merge; what has been published is itself a
journal, local to the run folder (publish/<id>/state.jsonl, appended and fsync'ed), one line per step:

    {"op": "shard", "seq": 7, "name": "part-000007-<digest>.parquet", "ranges": [[batch, start, end], ...], "rows": 40}
    {"op": "done", "seq": 7}
    {"op": "skip", "seq": 8, "ranges": [...]}                  journal bytes with nothing to publish
    {"op": "compact", "seq": 9, "name": "compact-9999999990-<digest>.parquet", "ranges": [...], "rows": ..., "replaces": [names]}

A shard is the entries of byte ranges of batch files. Its line is written BEFORE the shard is made
visible, so a run killed at any moment finds, on resume, either nothing (the ranges are published
again, from scratch) or the shard's ranges (the same shard is written again under the same name, with
the same rows: the journal only grows): no entry is skipped, none is published twice. `done` marks a
shard visible; a `compact` line names the shards it replaces.

Compaction and glob readers. A reader of `URL/**/*.parquet` lists the files, then reads them. No
order of single-file steps on a folder or S3 (neither has a multi-file atomic step) can move rows
from small shards into a compacted one without some listing showing both (an entry twice), or
neither (entries missing), or a listed file gone when read. So compaction makes every inconsistent
moment LOUD rather than silent, in three steps:

  1. mark: the compacted shard's name is written first holding COMPACTING (not Parquet: reading it
     fails); its name sorts before every shard it replaces ("compact-" < "part-", and a later
     compaction's before an earlier one's);
  2. remove the small shards it replaces, then wait COMPACT_GRACE seconds;
  3. reveal: the compacted shard's bytes replace the marker in one atomic write.

A load (list, then read) sees one of: the small shards (listed and read before step 2: the old
files, consistent), the compacted shard alone (listed after step 3: consistent), or an error: the
marker is not Parquet, or a listed small shard is gone. It never sees an entry twice nor a dataset
that shrank, provided it reads the files in name order (datasets reads local files so, and remote
ones so when fewer than 16) or reads them all within COMPACT_GRACE of its listing: seeing both a
small shard and the revealed compacted one needs a read of the small one before step 2 and a read
of the compacted one after step 3, which in name order come the other way round, and are otherwise
at least COMPACT_GRACE apart. The window (steps 1-3) happens at a run's end only (and on
`hermes-batch publish`), when small shards are compacted; a reader that meets it lists again. A
worker killed inside it leaves the marker (loud, never wrong) until the next invocation's open()
goes through the three steps again.

Which entries: per key, its first line that did not fail (the merge's winner), when it is kept
(completed or partial), calls no hallucinated tool, passes --require_check_pass when the run has it,
and the --publish_only filter. A failed attempt is not final and is never published; its retry, when
it succeeds, is. A key's lines are all in one batch file (a resumed run owes only keys that never
succeeded), so the first-line rule is kept per file.

Memory: the rows waiting for their shard (--publish_every bounds them), one batch file at a time when
a shard is rebuilt or compacted, and a cursor per batch file.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from pydantic_core import from_json

from hermes.data import journal
from hermes.data.run_paths import RunPaths
from hermes.run.export import ONLY
from hermes.run.publish_target import Target
from hermes.run.shards import PublishError, shape

log = logging.getLogger(__name__)

#: a compacted shard holds at most this many entries; shards below half of it are compacted
COMPACT_ROWS = 50_000
#: seconds between the last small shard's removal and the compacted shard's reveal (the module's
#: docstring: a reader reading out of name order is protected when its load is shorter than this)
COMPACT_GRACE = 2.0
#: what a compacted shard's name holds until its rows are revealed: not Parquet, so a reader fails
COMPACTING = b"hermes-batch: compaction in progress; list the files again\n"
#: rows held for a shard at most, whatever --publish_every says (memory stays bounded)
MAX_PENDING = 10_000
#: hermes.data.entry.KEPT's values (tests/run/test_publish.py holds them equal): importing that module
#: builds its pydantic models, a quarter of a second of the worker's start on a busy machine
KEPT = ("completed", "partial")


def state_dir(run_path: Path, url: str, fmt: str, only: str | None) -> Path:
    """One state per (URL, format, filter): two publications of one run never share a cursor."""
    digest = hashlib.sha256(json.dumps([url, fmt, only]).encode()).hexdigest()[:12]
    return RunPaths(run_path).root / "publish" / digest


def parse_every(text: str) -> tuple[int | None, float | None]:
    """'1000' (entries), '30s' (seconds) or both, comma separated: (entries, seconds)."""
    entries = seconds = None
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        try:
            if part.endswith("s"):
                seconds = float(part[:-1])
            else:
                entries = int(part)
        except ValueError:
            raise PublishError(f"--publish_every {text!r}: entries (1000), seconds (30s) or both (1000,30s)") from None
    if entries is None and seconds is None:
        raise PublishError(f"--publish_every {text!r}: entries (1000), seconds (30s) or both (1000,30s)")
    return entries, seconds


@dataclass
class _Pending:
    """Journal ranges read but not yet in a shard, and their rows."""

    ranges: dict[int, list[int]] = field(default_factory=dict)  # batch -> [start, end]
    rows: list[dict] = field(default_factory=list)
    since: float | None = None  # when its oldest range was read

    def add(self, num: int, start: int, end: int, rows: list[dict]) -> None:
        if num in self.ranges:
            self.ranges[num][1] = end  # contiguous: the cursor moved on from the last end
        else:
            self.ranges[num] = [start, end]
        self.rows += rows
        if self.since is None:
            self.since = time.monotonic()


class Publication:
    """One run's publication to one URL in one shape; hold it with open() (an exclusive lock)."""

    def __init__(self, run_path: Path, url: str, fmt: str = "openai", only: str | None = None,
                 every: str = "1000,60s", require_check_pass: bool | None = None):
        self.run_path = Path(run_path)
        self.paths = RunPaths(self.run_path)
        self.shape = shape(fmt)
        if only is not None and only not in ONLY:
            raise PublishError(f"--publish_only {only!r}: one of {', '.join(ONLY)}")
        self.fmt, self.only = fmt, only
        self.every_entries, self.every_seconds = parse_every(every)
        if require_check_pass is None:
            # run.json, read directly: the worker process does not load the settings' module tree
            try:
                settings = json.loads(self.paths.manifest.read_text(encoding="utf-8")).get("settings") or {}
            except (OSError, ValueError):
                settings = {}
            require_check_pass = bool(settings.get("require_check_pass"))
        self.require_check_pass = require_check_pass
        self.target = Target(url)
        self.dir = state_dir(self.run_path, self.target.url, fmt, only)
        self.state = self.dir / "state.jsonl"
        self.cursors: dict[int, int] = {}
        self.live: dict[str, dict] = {}  # visible shards: name -> {"seq", "rows", "ranges"}
        self.seq = 0
        self.pending = _Pending()
        self._lock_fd: int | None = None
        self._schema = None

    # ------------------------------------------------------------------ state
    def open(self, wait: bool = True) -> "Publication":
        """Take the lock (wait: for an earlier invocation's worker to end), replay the state, and
        finish whatever step a killed invocation left half done."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            raise PublishError(f"{self.target.url} is being published from {self.run_path} by another process "
                               f"(a run still going?): try again when it has ended") from None
        self._lock_fd = fd
        unfinished: dict[int, dict] = {}
        if self.state.exists():
            journal.seal(self.state)
            for step in journal.read(self.state):
                self.seq = max(self.seq, step.get("seq", 0))
                if step["op"] == "done":
                    self._visible(unfinished.pop(step["seq"]))
                    continue
                for num, _, end in step.get("ranges", ()):
                    self.cursors[num] = max(self.cursors.get(num, 0), end)
                if step["op"] != "skip":
                    unfinished[step["seq"]] = step
        for step in unfinished.values():  # in order: a shard before the compaction that may follow it
            log.info("publish: finishing %s %s left by an earlier invocation", step["op"], step["name"])
            self._write(step, self._rows_of(step["ranges"]), logged=True)
        return self

    def prepare(self) -> None:
        """Load what writing a shard needs (pyarrow, the schema) now, not when the first shard is due:
        the worker calls it at its start, while the run's prompts go, so that the run's end does not
        wait for it."""
        import pyarrow.parquet  # noqa: F401

        self._schema = self._schema or self.shape.schema()
        self.target.warm()

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None

    def _log(self, step: dict) -> None:
        journal.append(self.state, step)

    def _visible(self, step: dict) -> None:
        for name in step.get("replaces", ()):
            self.live.pop(name, None)
        self.live[step["name"]] = {"seq": step["seq"], "rows": step["rows"], "ranges": step["ranges"]}

    def _done(self, step: dict) -> None:
        self._log({"op": "done", "seq": step["seq"]})
        self._visible(step)

    # ------------------------------------------------------------------ reading the journal
    def _entries(self, num: int, start: int, end: int | None) -> tuple[list[dict], int]:
        """(rows to publish, end of the last complete line) of batch file `num` from byte `start`."""
        path = self.paths.batch(num)
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            return [], start
        rows, seen = [], set()
        with f:
            at = 0
            for raw in f:
                if not raw.endswith(b"\n") or (end is not None and at + len(raw) > end):
                    break
                at += len(raw)
                row = self._line(raw, seen, wanted=at > start)  # before start: only its key is noted
                if row is not None:
                    rows.append(row)
        return rows, max(at, start)

    def _line(self, raw: bytes, seen: set, wanted: bool = True) -> dict | None:
        """The row of one journal line, when it is its key's final, published entry; records its key."""
        try:
            entry = from_json(raw)
        except ValueError:
            return None  # a sealed torn line
        if not isinstance(entry, dict):
            return None
        meta = entry.pop("hermes", None) or {}
        status, key = meta.get("status"), meta.get("key")
        if status == "failed" or key in seen:
            return None
        seen.add(key)
        if not wanted or status not in KEPT or meta.get("hallucinated_tools"):
            return None
        reward = entry.get("reward")
        if self.require_check_pass and not (isinstance(reward, dict) and reward.get("passed")):
            return None
        if self.only and not ONLY[self.only](entry):
            return None
        return self.shape.row({**entry, "hermes": meta} if self.shape.needs_meta else entry)

    def _rows_of(self, ranges: list) -> Iterator[list[dict]]:
        for num, start, end in ranges:
            yield self._entries(num, start, end)[0]

    # ------------------------------------------------------------------ publishing
    def landed(self, num: int) -> None:
        """Read what batch file `num` holds past its cursor into the pending shard."""
        start = self.cursors.get(num, 0)
        rows, end = self._entries(num, start, None)
        if end > start:
            self.cursors[num] = end
            self.pending.add(num, start, end, rows)

    def catch_up(self) -> None:
        """Every batch file's bytes past its cursor (a resumed run's earlier batches, or after the fact)."""
        for num, size in sorted(self.paths.batch_sizes().items()):
            if size > self.cursors.get(num, 0):
                self.landed(num)
                if self.due():
                    self.flush()

    def due(self) -> bool:
        p = self.pending
        if not p.ranges:
            return False
        return (len(p.rows) >= MAX_PENDING or
                (self.every_entries is not None and len(p.rows) >= self.every_entries) or
                (self.every_seconds is not None and time.monotonic() - p.since >= self.every_seconds))

    def wait_seconds(self) -> float | None:
        """Seconds until the pending rows are due by time (None: nothing pending, or no time limit)."""
        if not self.pending.ranges or self.every_seconds is None:
            return None
        return max(0.0, self.every_seconds - (time.monotonic() - self.pending.since))

    def flush(self, manifest: bool = True) -> str | None:
        """The pending rows as one shard (its name), or a skip line when there are none."""
        p, self.pending = self.pending, _Pending()
        if not p.ranges:
            return None
        ranges = [[num, s, e] for num, (s, e) in sorted(p.ranges.items())]
        self.seq += 1
        if not p.rows:
            self._log({"op": "skip", "seq": self.seq, "ranges": ranges})
            return None
        step = {"op": "shard", "seq": self.seq, "name": self._name(self.seq, ranges), "ranges": ranges,
                "rows": len(p.rows)}
        self._write(step, iter([p.rows]))
        if manifest:
            self.write_manifest(complete=False)
        return step["name"]

    def compact(self) -> int:
        """Shards under half of COMPACT_ROWS, in runs of consecutive ones, become one shard each
        (at most COMPACT_ROWS entries): mark, remove, reveal (the module's docstring)."""
        groups, group = [], []
        for name, shard in sorted(self.live.items(), key=lambda kv: kv[1]["seq"]):
            if shard["rows"] >= COMPACT_ROWS // 2 or sum(s["rows"] for _, s in group) + shard["rows"] > COMPACT_ROWS:
                groups.append(group)
                group = []
            if shard["rows"] < COMPACT_ROWS // 2:
                group.append((name, shard))
        groups.append(group)
        done = 0
        for group in (g for g in groups if len(g) > 1):
            ranges = [r for _, s in group for r in s["ranges"]]
            self.seq += 1
            step = {"op": "compact", "seq": self.seq, "name": self._name(self.seq, ranges, "compact"),
                    "ranges": ranges, "rows": sum(s["rows"] for _, s in group), "replaces": [n for n, _ in group]}
            self._write(step, self._rows_of(ranges))
            done += 1
        return done

    @staticmethod
    def _name(seq: int, ranges: list, kind: str = "part") -> str:
        digest = hashlib.sha256(json.dumps(ranges).encode()).hexdigest()[:8]
        # a compacted shard's name sorts before the shards it replaces, a later one's before an earlier's
        return f"part-{seq:06d}-{digest}.parquet" if kind == "part" else f"compact-{10**10 - 1 - seq:010d}-{digest}.parquet"

    def _write(self, step: dict, chunks: Iterator[list[dict]], logged: bool = False) -> None:
        """Write the rows to a local file, log the step (unless it is an earlier invocation's), make
        the shard visible (a compaction: mark, remove, reveal), then log it done."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = self._schema = self._schema or self.shape.schema()
        name, replaces = step["name"], list(step.get("replaces", ()))
        local = self.dir / f".{name}.local"
        with pq.ParquetWriter(local, schema) as writer:
            for rows in chunks:
                if rows:
                    writer.write_table(pa.Table.from_pylist(rows, schema=schema))
        try:
            if not logged:
                self._log(step)
            if replaces:
                self.target.put_bytes(COMPACTING, f"data/{name}")
                self.target.remove(replaces)
                time.sleep(COMPACT_GRACE)
            self.target.put(local, f"data/{name}")
        finally:
            local.unlink(missing_ok=True)
        self._done(step)

    def write_manifest(self, complete: bool) -> None:
        shards = [{"name": n, **s} for n, s in sorted(self.live.items(), key=lambda kv: kv[1]["seq"])]
        self.target.write_manifest({
            "run_name": self.run_path.name, "url": self.target.url, "format": self.fmt, "only": self.only,
            "complete": complete, "entries": sum(s["rows"] for s in shards), "shards": shards,
            # a shard's entries: byte ranges [batch, start, end) of the run's batch files
            "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    def summary(self) -> dict[str, Any]:
        return {"url": self.target.url, "format": self.fmt, "only": self.only, "shards": len(self.live),
                "entries": sum(s["rows"] for s in self.live.values()),
                "data_files": f"{self.target.url.rstrip('/')}/data/*.parquet"}

    def finish(self, compact: bool = True) -> dict[str, Any]:
        """The end of an invocation (or `hermes-batch publish`): everything landed goes out, small
        shards are compacted (unless --publish_compact false: readers then never meet a compaction),
        the manifest says complete; a summary is kept in the run folder."""
        self.catch_up()
        self.flush(manifest=False)  # the manifest is written once, complete, below
        if compact:
            self.compact()
        self.write_manifest(complete=True)
        summary = self.summary()
        journal.write_atomic(self.dir / "summary.json", json.dumps(summary, indent=1) + "\n")
        return summary


def published(run_path: Path) -> list[dict[str, Any]]:
    """The summaries of a run's publications (for reports): where, how many entries and shards."""
    out = []
    for path in sorted((RunPaths(run_path).root / "publish").glob("*/summary.json")):
        try:
            out.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return out
