"""Stored responses in SQLite: they survive a restart, and only the `limit` most recently used
are kept (least recently used go first).

A stored response keeps the whole conversation up to and including it (chat format, tool calls
and results too), so `previous_response_id` continues it without walking a chain of rows, and
evicting an old response never breaks a newer one. A named conversation points at its latest
response; when that response is evicted the name is kept (the most recent `10 * limit` such
names), so the next turn is told its history is gone (`evicted`) instead of silently starting
over. Deleting a conversation's latest response deletes the name: the client asked for that.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    used INTEGER NOT NULL,            -- recency counter: higher is more recently used
    conversation TEXT,
    response TEXT NOT NULL,           -- the response object, as answered
    messages TEXT NOT NULL            -- the conversation through this response, chat format
);
CREATE INDEX IF NOT EXISTS responses_used ON responses(used);
CREATE TABLE IF NOT EXISTS conversations (
    name TEXT PRIMARY KEY,
    response_id TEXT NOT NULL
);
"""


@dataclass
class Stored:
    id: str
    response: dict[str, Any]
    messages: list[dict[str, Any]]
    conversation: str | None


class ResponseStore:
    def __init__(self, path: Path, limit: int = 100):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.limit = limit
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._used = self._db.execute("SELECT COALESCE(MAX(used), 0) FROM responses").fetchone()[0]

    def _tick(self) -> int:
        self._used += 1
        return self._used

    def put(self, id: str, response: dict[str, Any], messages: list[dict[str, Any]], conversation: str | None) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                             (id, time.time(), self._tick(), conversation, json.dumps(response), json.dumps(messages)))
            if conversation:
                self._db.execute("INSERT OR REPLACE INTO conversations VALUES (?, ?)", (conversation, id))
            self._db.execute("DELETE FROM responses WHERE id NOT IN (SELECT id FROM responses ORDER BY used DESC LIMIT ?)",
                             (self.limit,))
            # names whose latest response was evicted stay (bounded): see latest()
            self._db.execute("DELETE FROM conversations WHERE response_id NOT IN (SELECT id FROM responses) AND rowid NOT IN "
                             "(SELECT rowid FROM conversations WHERE response_id NOT IN (SELECT id FROM responses) "
                             "ORDER BY rowid DESC LIMIT ?)", (10 * self.limit,))

    def get(self, id: str) -> Stored | None:
        """The stored response, counted as a use (it moves to the back of the eviction line)."""
        with self._lock, self._db:
            row = self._db.execute("SELECT id, response, messages, conversation FROM responses WHERE id = ?",
                                   (id,)).fetchone()
            if row is None:
                return None
            self._db.execute("UPDATE responses SET used = ? WHERE id = ?", (self._tick(), id))
        return Stored(row[0], json.loads(row[1]), json.loads(row[2]), row[3])

    def latest(self, conversation: str) -> tuple[str | None, bool]:
        """(the conversation's latest response id, whether that response has been evicted);
        (None, False) for a name never used."""
        with self._lock:
            row = self._db.execute("SELECT c.response_id, r.id IS NULL FROM conversations c "
                                   "LEFT JOIN responses r ON r.id = c.response_id WHERE c.name = ?",
                                   (conversation,)).fetchone()
        return (row[0], bool(row[1])) if row else (None, False)

    def delete(self, id: str) -> bool:
        with self._lock, self._db:
            self._db.execute("BEGIN")
            gone = self._db.execute("DELETE FROM responses WHERE id = ?", (id,)).rowcount
            self._db.execute("DELETE FROM conversations WHERE response_id = ?", (id,))
        return bool(gone)

    def counts(self) -> dict[str, int]:
        with self._lock:
            responses = self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
            conversations = self._db.execute("SELECT COUNT(*) FROM conversations WHERE response_id IN "
                                             "(SELECT id FROM responses)").fetchone()[0]
        return {"responses": responses, "conversations": conversations, "limit": self.limit}

    def close(self) -> None:
        with self._lock:
            self._db.close()
