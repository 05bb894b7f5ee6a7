"""Progress of a run, shown twice: a Prefect progress artifact and a line in the terminal."""
from __future__ import annotations

import contextvars
import threading

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from hermes.run.progress import ProgressLine
from tasks.link import PrefectLink
from tasks.report import artifact_key


class RunProgress(ProgressLine):
    """The terminal line, and the same percentage in a Prefect progress artifact.

    The artifact is updated from a thread of its own with the latest value only: prompt threads
    report progress under a lock, and an API that has gone away takes a minute of client retries
    to say so, which must stall no prompt.
    """

    def __init__(self, run_name: str, total: int, link: PrefectLink, *, min_interval: float = 1.0):
        super().__init__(total, min_interval=min_interval)
        self.run_name = run_name
        self.link = link
        self._pending: float | None = None
        self._wake = threading.Condition()
        self._closed = False
        self._artifact = link.call("create the progress artifact", lambda: create_progress_artifact(
            progress=0.0 if total else 100.0, key="progress-" + artifact_key(run_name),
            description=f"Prompts finished in run '{run_name}' ({total} owed at start)"))
        # In this context's copy: Prefect's settings (the API URL of an in-process caller's
        # temporary_settings) live in context variables, which a plain thread does not inherit;
        # without them its first update booted an ephemeral server of its own (seconds, and the
        # artifact never moved).
        self._poster = threading.Thread(target=contextvars.copy_context().run, args=(self._post,),
                                        name="progress-artifact", daemon=True)
        if self._artifact is not None:
            self._poster.start()

    def show(self, finished: int, counts: dict[str, int]) -> None:
        with self._wake:
            self._pending = self.percent(finished)
            self._wake.notify()
        super().show(finished, counts)

    def close(self, timeout: float = 60.0) -> None:
        """Post the last value before the run's report, unless Prefect is gone."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._poster.is_alive() and self.link.answers():
            self._poster.join(timeout)

    def _post(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._pending is not None or self._closed)
                value, self._pending = self._pending, None
            if value is not None:
                if not self.link.call("update the progress artifact",
                                      lambda: update_progress_artifact(self._artifact, progress=value) or True):
                    return
            elif self._closed:
                return


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
