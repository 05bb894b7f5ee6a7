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
import zoneinfo
from typing import Annotated, Any, Literal, Protocol

from fastapi import APIRouter, Request
from pydantic import AfterValidator, ConfigDict, Field, StrictBool, ValidationError, WithJsonSchema, model_validator

from hermes.errors import HermesError
from hermes.api.content import TextOnly
from hermes.api.errors import ApiError, not_found
from hermes.settings import RunSettings

router = APIRouter()

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class JobNotFound(HermesError, LookupError):
    pass


class JobConflict(HermesError, ValueError):
    pass


class JobInvalid(HermesError, ValueError):
    pass


class JobKindMismatch(JobInvalid):
    """A change that does not fit the job's kind (batch settings for a prompt job, ...): the
    body is well-formed, it conflicts with the job as it is (409)."""


class JobsUnavailable(HermesError, RuntimeError):
    """The backend cannot be reached (say, the Prefect server is down)."""

    transient = True


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


def _names(*names: str) -> str:
    return "|".join(n for name in names for n in (name, name.lower()))


def _field(value: str) -> str:
    """One cron field: *, a value or a range, each with an optional /step, in a comma list."""
    item = f"(?:\\*|(?:{value})(?:-(?:{value}))?)(?:/[1-9][0-9]?)?"
    return f"{item}(?:,{item})*"


#: a five-field cron expression with the values each field can hold, as Prefect (croniter)
#: takes it. In the schema too, so that a schedule the document calls valid is one Prefect takes.
CRON_PATTERN = "^" + " ".join(_field(v) for v in (
    "[0-5]?[0-9]",                                                       # minute
    "[01]?[0-9]|2[0-3]",                                                 # hour
    "0?[1-9]|[12][0-9]|3[01]",                                           # day of month
    "0?[1-9]|1[0-2]|" + _names("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"),
    "[0-7]|" + _names("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"),  # day of week
)) + "$"
#: the IANA time zones of this machine's zoneinfo (what Prefect's schedules take)
TIMEZONES = sorted(zoneinfo.available_timezones())

#: documented as the batch-run settings (their schema is added to the document: openapi.py)
Batch = Annotated[dict[str, Any] | None, AfterValidator(_check_batch),
                  WithJsonSchema({"anyOf": [{"$ref": "#/components/schemas/RunSettings"}, {"type": "null"}]})]
Cron = Annotated[str, Field(pattern=CRON_PATTERN, description="cron: minute hour day-of-month month day-of-week, "
                            "like '0 3 * * *'; single spaces between fields")] | None
TimeZone = Literal[tuple(TIMEZONES)]  # type: ignore[valid-type]


#: exactly one of prompt and batch; instructions only with a prompt (as _one_kind checks)
ONE_KIND = {"oneOf": [
    {"required": ["prompt"], "properties": {"prompt": {"type": "string"}, "batch": {"type": "null"}}},
    {"required": ["batch"], "properties": {"batch": {"type": "object"}, "prompt": {"type": "null"},
                                           "instructions": {"anyOf": [{"type": "null"}, {"const": ""}]}}},
]}


class JobSpec(TextOnly):
    model_config = ConfigDict(extra="forbid", json_schema_extra=ONE_KIND)

    name: str = Field(pattern=NAME_PATTERN, description="unique among jobs; names the Prefect deployment")
    prompt: str | None = Field(None, min_length=1)
    instructions: str | None = None
    batch: Batch = None
    schedule: Cron = None
    timezone: TimeZone = "UTC"
    paused: StrictBool = False
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

    prompt: Annotated[str, Field(min_length=1)] = None  # type: ignore[assignment] - null is no prompt: refused
    instructions: str | None = None
    batch: Batch = None
    schedule: Cron = None
    timezone: TimeZone | None = None
    paused: StrictBool | None = None
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
    except JobKindMismatch as e:
        raise ApiError(409, str(e), "job_kind_mismatch") from None
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
