"""Progress of a run, shown twice: a Prefect progress artifact and a line in the terminal."""
from __future__ import annotations

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from hermes.progress import ProgressLine
from tasks.report import artifact_key


class RunProgress(ProgressLine):
    """The terminal line, and the same percentage in a Prefect progress artifact."""

    def __init__(self, run_name: str, total: int, *, min_interval: float = 1.0):
        super().__init__(total, min_interval=min_interval)
        self.run_name = run_name
        self._artifact = create_progress_artifact(
            progress=0.0 if total else 100.0, key="progress-" + artifact_key(run_name),
            description=f"Prompts finished in run '{run_name}' ({total} owed at start)")

    def show(self, finished: int, counts: dict[str, int]) -> None:
        update_progress_artifact(self._artifact, progress=self.percent(finished))
        super().show(finished, counts)


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
