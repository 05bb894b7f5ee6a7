"""/api/jobs: scheduled agent work, managed remotely.

The API talks to a JobsBackend; hermes/ knows nothing of how jobs are kept or run. The
product's backend (flows/scheduled_jobs.py) keeps each job as a Prefect deployment with a cron
schedule, so jobs show up, run and can be watched in the Prefect UI.

A job is one prompt for the agent (`prompt`, optional `instructions`) or a whole batch run
(`batch`: the batch-run settings, as `hermes-batch run` takes them), on a `schedule` (cron,
optional: a job without one runs only when asked):

    {"object": "hermes.job", "id", "name", "kind": "prompt"|"batch", "prompt", "instructions",
     "batch", "schedule", "timezone", "paused", "next_run_at", "last_run", "created_at",
     "updated_at", "backend": {...}}
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Request
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from hermes.api.content import TextOnly
from hermes.api.errors import ApiError, not_found
from hermes.settings import RunSettings

router = APIRouter()

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class JobNotFound(LookupError):
    pass


class JobConflict(ValueError):
    pass


class JobInvalid(ValueError):
    pass


class JobsUnavailable(RuntimeError):
    """The backend cannot be reached (say, the Prefect server is down)."""


def _check_batch(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        RunSettings.model_validate(value)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"batch.{where}: {first['msg']}") from None
    return value


def _check_cron(value: str | None) -> str | None:
    if value is not None and len(value.split()) not in (5, 6):
        raise ValueError("schedule must be a cron expression of 5 fields, like '0 * * * *'")
    return value


Batch = Annotated[dict[str, Any] | None, AfterValidator(_check_batch)]
Cron = Annotated[str | None, AfterValidator(_check_cron)]


class JobSpec(TextOnly):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="unique among jobs; names the Prefect deployment")
    prompt: str | None = Field(None, min_length=1)
    instructions: str | None = None
    batch: Batch = None
    schedule: Cron = None
    timezone: str = "UTC"
    paused: bool = False
    description: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> "JobSpec":
        if (self.prompt is None) == (self.batch is None):
            raise ValueError("a job has either a prompt or a batch")
        if self.instructions and self.batch is not None:
            raise ValueError("instructions belong to prompt jobs (a batch has ephemeral_system_prompt)")
        return self

    @property
    def kind(self) -> str:
        return "prompt" if self.prompt is not None else "batch"


class JobPatch(TextOnly):
    """Fields to change; those left out stay as they are (`schedule: null` removes the schedule)."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | None = Field(None, min_length=1)
    instructions: str | None = None
    batch: Batch = None
    schedule: Cron = None
    timezone: str | None = None
    paused: bool | None = None
    description: str | None = None


class JobsBackend(Protocol):
    """Where jobs live. Every method raises JobNotFound for an unknown id, JobInvalid for a
    change the backend cannot make, JobsUnavailable when it cannot be reached."""

    async def list_jobs(self) -> list[dict[str, Any]]: ...
    async def create_job(self, spec: JobSpec) -> dict[str, Any]: ...   # JobConflict: name taken
    async def get_job(self, job_id: str) -> dict[str, Any]: ...
    async def update_job(self, job_id: str, patch: JobPatch) -> dict[str, Any]: ...
    async def delete_job(self, job_id: str) -> None: ...                # cancels its runs in flight
    async def pause_job(self, job_id: str) -> dict[str, Any]: ...
    async def resume_job(self, job_id: str) -> dict[str, Any]: ...
    async def run_job(self, job_id: str) -> dict[str, Any]: ...         # {"job_id", "run_id", "state", ...}
    async def health(self) -> bool: ...
    async def start(self) -> None: ...    # with the server (say, a worker that runs the jobs)
    async def close(self) -> None: ...    # when the server stops


async def _call(request: Request, method: str, *args: Any) -> Any:
    backend: JobsBackend | None = request.app.state.jobs
    if backend is None:
        raise ApiError(503, "jobs are not available on this server (it has no Prefect server: set PREFECT_API_URL)",
                       "jobs_unavailable")
    try:
        return await getattr(backend, method)(*args)
    except JobNotFound:
        raise not_found("job", str(args[0]) if args else "?") from None
    except JobConflict as e:
        raise ApiError(409, str(e), "job_exists", "name") from None
    except JobInvalid as e:
        raise ApiError(400, str(e), "invalid_request") from None
    except JobsUnavailable as e:
        raise ApiError(503, f"the jobs backend cannot be reached: {e}", "jobs_unavailable",
                       headers={"Retry-After": "10"}) from None


_ID = re.compile(r"^[A-Za-z0-9-]{1,64}$")


def _id(job_id: str) -> str:
    if not _ID.match(job_id):
        raise not_found("job", job_id[:64])
    return job_id


@router.get("/api/jobs")
async def list_jobs(request: Request):
    return {"object": "list", "data": await _call(request, "list_jobs")}


@router.post("/api/jobs", status_code=201)
async def create_job(spec: JobSpec, request: Request):
    return await _call(request, "create_job", spec)


@router.get("/api/jobs/{job_id}")
async def get_job(job_id: str, request: Request):
    return await _call(request, "get_job", _id(job_id))


@router.patch("/api/jobs/{job_id}")
async def update_job(job_id: str, patch: JobPatch, request: Request):
    return await _call(request, "update_job", _id(job_id), patch)


@router.delete("/api/jobs/{job_id}")
async def delete_job(job_id: str, request: Request):
    await _call(request, "delete_job", _id(job_id))
    return {"object": "hermes.job", "id": job_id, "deleted": True}


@router.post("/api/jobs/{job_id}/pause")
async def pause_job(job_id: str, request: Request):
    return await _call(request, "pause_job", _id(job_id))


@router.post("/api/jobs/{job_id}/resume")
async def resume_job(job_id: str, request: Request):
    return await _call(request, "resume_job", _id(job_id))


@router.post("/api/jobs/{job_id}/run", status_code=202)
async def run_job(job_id: str, request: Request):
    return await _call(request, "run_job", _id(job_id))
