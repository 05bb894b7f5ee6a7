"""Progress of a run, shown twice: a Prefect progress artifact and a line in the terminal."""
from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import Any

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from tasks.report import artifact_key


class RunProgress:
    def __init__(self, run_name: str, total: int, *, min_interval: float = 1.0):
        self.run_name, self.total = run_name, total
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._last = 0.0
        self._min_interval = min_interval
        self._tty = sys.stderr.isatty()
        self._artifact = create_progress_artifact(
            progress=0.0 if total else 100.0, key="progress-" + artifact_key(run_name),
            description=f"Prompts finished in run '{run_name}' ({total} owed at start)")

    def prompt_done(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.counts[entry["hermes"]["status"]] += 1
            finished = sum(self.counts.values())
            now = time.monotonic()
            if now - self._last < self._min_interval and finished < self.total:
                return
            self._last = now
            counts = dict(self.counts)
            self.show(finished, counts)

    def show(self, finished: int, counts: dict[str, int]) -> None:
        pct = 100.0 * finished / self.total if self.total else 100.0
        update_progress_artifact(self._artifact, progress=pct)
        width = 30
        bar = "#" * int(width * pct / 100)
        detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        line = f"[{bar:<{width}}] {finished}/{self.total} prompts ({pct:.0f}%) {detail}"
        if self._tty:
            sys.stderr.write("\r" + line + ("\n" if finished >= self.total else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def started_in_this_flow_run(run_name: str) -> bool:
    """Whether an earlier attempt of the current flow run already ran `run_name` (made its progress artifact).

    True for a flow run retried from the UI ("Retry") after it got past opening the run.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
    from prefect.runtime import flow_run

    if not flow_run.id or flow_run.run_count <= 1:
        return False
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(limit=1, artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id]),
            key=ArtifactFilterKey(any_=["progress-" + artifact_key(run_name)])))
    return bool(found)
