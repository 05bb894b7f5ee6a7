"""A run's progress line in the terminal: a bar, prompts finished of owed, counts by outcome."""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from hermes.data.journal_lines import outcome_block
from hermes.data.run_paths import batch_name


class ProgressLine:
    """Fed one journal entry per finished prompt (RunContext.on_prompt_done); redraws at most once a second."""

    def __init__(self, total: int, *, min_interval: float = 1.0):
        self.total = total
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._last = 0.0
        self._min_interval = min_interval
        self._tty = sys.stderr.isatty()
        self._terminal_gone = False

    def prompt_done(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.counts[entry["hermes"]["status"]] += 1
            finished = sum(self.counts.values())
            now = time.monotonic()
            if now - self._last < self._min_interval and finished < self.total:
                return
            self._last = now
            self.show(finished, dict(self.counts))

    def percent(self, finished: int) -> float:
        return 100.0 * finished / self.total if self.total else 100.0

    def show(self, finished: int, counts: dict[str, int]) -> None:
        pct = self.percent(finished)
        width = 30
        bar = "#" * int(width * pct / 100)
        detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        line = f"[{bar:<{width}}] {finished}/{self.total} prompts ({pct:.0f}%) {detail}"
        if self._terminal_gone:
            return
        try:
            if self._tty:
                sys.stderr.write("\r" + line + ("\n" if finished >= self.total else ""))
            else:
                sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            # The reader of our stderr is gone (a killed Prefect worker, a closed terminal): the run
            # goes on, its progress is in the journal; a progress line must never fail a prompt.
            self._terminal_gone = True


class JournalTail:
    """Progress of prompts that finish in other processes (Dask workers): new complete lines of
    the run's batch files, polled, each fed to `on_entry` as {"hermes": its block}.

    The journal is the one record every worker writes anyway, on storage the flow's process
    reads; a line is counted once it is whole (a torn line, later sealed, is unreadable and
    skipped). A poll is one directory listing plus a read of each file that grew: thousands of
    batches still owed cost no open() each on shared storage. A landed batch is read to its end
    and dropped (finish).
    """

    def __init__(self, run_dir: Path, batch_nums: list[int], on_entry: Callable[[dict[str, Any]], None],
                 *, interval: float = 0.5):
        self.run_dir = run_dir
        self.on_entry = on_entry
        self.interval = interval
        self._offsets = {batch_name(n): 0 for n in batch_nums}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="journal-tail", daemon=True)

    def start(self) -> "JournalTail":
        self._thread.start()
        return self

    def watch(self, batch_nums: list[int]) -> None:
        """Batches made after the start (an attempt policy's): look at them too."""
        with self._lock:
            for n in batch_nums:
                self._offsets.setdefault(batch_name(n), 0)

    def finish(self, batch_num: int) -> None:
        """The batch landed: count what is left of it, then stop looking at it."""
        with self._lock:
            name = batch_name(batch_num)
            if name in self._offsets:
                self._read(name)
                del self._offsets[name]

    def stop(self) -> None:
        """Stop polling, after one last look."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.poll()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        with self._lock:
            try:
                grown = [e.name for e in os.scandir(self.run_dir)
                         if e.name in self._offsets and e.stat().st_size > self._offsets[e.name]]
            except FileNotFoundError:
                return
            for name in grown:
                self._read(name)

    def _read(self, name: str) -> None:
        offset = self._offsets[name]
        try:
            with open(self.run_dir / name, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self._offsets[name] = offset + end
        for raw in data[:end].splitlines(keepends=True):
            block = outcome_block(raw)
            if block and block.get("status"):
                self.on_entry({"hermes": block})
