"""A run's progress line in the terminal: a bar, prompts finished of owed, counts by outcome."""
from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import Any


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
