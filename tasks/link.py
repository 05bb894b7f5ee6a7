"""Whether this flow run still reaches Prefect's API, and what a run does when it does not.

A run's work does not need Prefect: the journal, the index and the merge are all on disk.
So when the API goes away mid-run (the server stopped, the network cut), the run goes on
without it, finishes, merges and writes its outputs, then says so and exits. It exits at
once (os._exit) rather than returning into Prefect's engine, which would spend minutes
retrying to report a state and to deliver queued events to a server that is not there.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import httpx

from hermes.data.outcome import TooManyFailedPrompts
from hermes.data.run_paths import RunPaths

log = logging.getLogger("hermes.prefect")
T = TypeVar("T")
#: what a call to an API that has gone away raises (ConnectionError covers refused and broken pipes)
API_GONE = (httpx.TransportError, ConnectionError)
PROBE_TIMEOUT = 5.0


class PrefectLink:
    def __init__(self, api_url: str | None):
        self.api_url = (api_url or "").rstrip("/")
        self.lost: str | None = None  # what failed first, and when
        self._lock = threading.Lock()

    @classmethod
    def of_this_flow_run(cls) -> "PrefectLink":
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        client = getattr(ctx, "client", None) if ctx else None
        return cls(str(client.api_url) if client is not None else None)

    def lose(self, what: str, error: BaseException) -> None:
        with self._lock:
            if self.lost:
                return
            self.lost = f"{what} failed at {datetime.now():%H:%M:%S}: {type(error).__name__}: {error}"
        log.warning("Prefect's API at %s is unreachable (%s); the run goes on without it", self.api_url, self.lost)

    def call(self, what: str, fn: Callable[[], T]) -> T | None:
        """fn(), or None once the API is gone (this call noticing it, or an earlier one)."""
        if self.lost:
            return None
        try:
            return fn()
        except API_GONE as e:
            self.lose(what, e)
            return None

    def answers(self) -> bool:
        """A quick look, without the client's minute of retries, at whether the API is still there."""
        if self.lost:
            return False
        if not self.api_url:
            return True
        try:
            # Plain http (the local server) has no certificate to check: without verify the client
            # skips loading the CA bundle, a tenth of a second of each run's end.
            with httpx.Client(timeout=PROBE_TIMEOUT, verify=self.api_url.startswith("https://")) as probe:
                probe.get(f"{self.api_url}/health").raise_for_status()
            return True
        except httpx.HTTPError as e:
            self.lose("health check", e)
            return False

    @contextlib.contextmanager
    def finish_without_it(self, run_path: Callable[[], Path]) -> Iterator[None]:
        """Around a run: if the API went away, say so and exit with the run's outcome (0 done, 1 failed)."""
        try:
            yield
        except TooManyFailedPrompts as e:
            if not self.answers():
                self._exit(1, f"the run ended Failed: {e}")
            raise
        except Exception as e:
            if not self.answers():
                self._exit(1, f"the run failed: {type(e).__name__}: {e}")
            raise
        else:
            if self.lost:
                out = run_path()
                self._exit(0, f"the run finished without it: outputs {RunPaths(out).trajectories} and "
                              f"{RunPaths(out).statistics}; nothing is owed")

    def _exit(self, code: int, outcome: str) -> None:
        message = (f"PREFECT LOST: Prefect's API at {self.api_url} went away during this run ({self.lost}); "
                   f"{outcome}. Prefect was not told: its flow run stays Running until the zombie-run "
                   f"automation marks it Crashed. Every finished prompt is in the run's batch files; "
                   f"run again with resume: true for anything still owed.")
        log.error(message)
        with contextlib.suppress(OSError, ValueError):
            if not log.hasHandlers():  # under Prefect its console handler has printed it already
                sys.stderr.write(message + "\n")
            sys.stderr.flush()
            sys.stdout.flush()
        os._exit(code)
