"""The API server's jobs, kept as Prefect deployments: a job shows up, runs and is watched in
the Prefect UI like any other deployment.

    job                 -> a deployment tagged `hermes-job` in the work pool (default `hermes`,
                           the pool of prefect.yaml), of the `agent-prompt` flow below (a prompt
                           job) or of `batch-run` (a batch job; each run gets its own folder)
    schedule            -> the deployment's cron schedule
    pause / resume      -> the deployment paused and its schedule inactive, and back
    run now             -> a flow run created from the deployment
    delete              -> its runs in flight cancelled, then the deployment deleted

A worker of that pool runs them: `prefect worker start --pool hermes` from the repo, or
`hermes-batch serve --jobs-worker`. Scheduling needs a real Prefect server (PREFECT_API_URL).
"""
from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar
from uuid import UUID

import anyio
import httpx
from prefect import flow, get_client, get_run_logger
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.actions import DeploymentScheduleCreate, DeploymentUpdate, WorkPoolCreate
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterTags,
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterExpectedStartTime,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.schedules import CronSchedule
from prefect.client.schemas.sorting import FlowRunSort
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound, PrefectHTTPStatusError
from prefect.states import Cancelled, Cancelling
from prefect.utilities.callables import parameter_schema
from pydantic import ValidationError

from hermes.api.jobs import JobConflict, JobInvalid, JobKindMismatch, JobNotFound, JobPatch, JobsUnavailable, JobSpec

log = logging.getLogger(__name__)

JOB_TAG = "hermes-job"
REPO = Path(__file__).resolve().parent.parent
IN_FLIGHT = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED]


@flow(name="agent-prompt")
def agent_prompt(prompt: str, instructions: str | None = None) -> str:
    """One prompt through the agent, its tool calls in a sandbox of its own; returns the answer.

    The model endpoint and sandbox come from the worker's environment, as for the API server
    (HERMES_BASE_URL, HERMES_MODEL, HERMES_API_KEY, API_SERVER_*).
    """
    from hermes.api.service import AgentRequest, AgentService, final_text
    from hermes.api.server_settings import ApiSettings

    service = AgentService(ApiSettings.load())
    try:
        run = service.run_blocking(AgentRequest([{"role": "user", "content": prompt}], instructions))
    finally:
        service.close()
    answer = final_text(run.messages[1:])
    if run.error and not answer:
        raise RuntimeError(f"the model failed: {run.error}")
    get_run_logger().info("answer (%d model calls): %s", run.api_calls, answer)
    return answer


def _flows() -> dict[str, tuple[Any, str]]:
    from flows.batch import batch_run

    return {"prompt": (agent_prompt, "flows/scheduled_jobs.py:agent_prompt"), "batch": (batch_run, "flows/batch.py:batch_run")}


T = TypeVar("T")


def _translating(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Prefect's and httpx's failures, as the JobsBackend protocol names them."""

    @functools.wraps(method)
    async def wrapper(self: "PrefectJobs", *args: Any) -> T:
        try:
            return await method(self, *args)
        except ObjectNotFound:
            raise JobNotFound(args[0] if args else "?") from None
        except ValidationError as e:  # a schedule Prefect cannot use (bad cron, unknown time zone)
            raise JobInvalid("; ".join(err["msg"] for err in e.errors())) from None
        except PrefectHTTPStatusError as e:
            if e.response.status_code == 404:
                raise JobNotFound(args[0] if args else "?") from None
            if e.response.status_code in (409, 422):
                raise JobInvalid(e.response.text[:300]) from None
            raise JobsUnavailable(f"Prefect answered {e.response.status_code}") from None
        except (httpx.TransportError, OSError) as e:
            raise JobsUnavailable(type(e).__name__) from None

    return wrapper


class PrefectJobs:
    """The JobsBackend of hermes/api/jobs.py on a Prefect server."""

    def __init__(self, work_pool: str = "hermes", *, start_worker: bool = False):
        self.work_pool = work_pool
        self.start_worker = start_worker
        self._pool_ready = False
        self._worker: subprocess.Popen | None = None

    # -- the worker ----------------------------------------------------------------

    async def start(self) -> None:
        """Start a `prefect worker` for the pool, when asked to: one command runs API and jobs."""
        if self.start_worker and self._worker is None:
            # its own process group, so stopping it also stops the flow runs it started
            self._worker = subprocess.Popen(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", self.work_pool, "--type", "process"],
                cwd=REPO, start_new_session=True)

    async def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            await anyio.to_thread.run_sync(_stop_process_group, worker)

    # -- reading -----------------------------------------------------------------

    async def _deployment(self, client: PrefectClient, job_id: str):
        try:
            deployment = await client.read_deployment(UUID(job_id))
        except ValueError:
            raise JobNotFound(job_id) from None
        if JOB_TAG not in (deployment.tags or []):  # other deployments are not the API's to touch
            raise JobNotFound(job_id)
        return deployment

    async def _view(self, client: PrefectClient, deployment) -> dict[str, Any]:
        params = deployment.parameters or {}
        kind = "batch" if (deployment.entrypoint or "").endswith(":batch_run") else "prompt"
        schedule = deployment.schedules[0] if deployment.schedules else None
        cron = schedule.schedule if schedule else None
        by_deployment = FlowRunFilterDeploymentId(any_=[deployment.id])
        upcoming = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(deployment_id=by_deployment, state=FlowRunFilterState(
                type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])),
                expected_start_time=FlowRunFilterExpectedStartTime(after_=datetime.now(timezone.utc))),
            sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=1)
        last = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(deployment_id=by_deployment, expected_start_time=FlowRunFilterExpectedStartTime(
                before_=datetime.now(timezone.utc))),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=1)
        paused = bool(deployment.paused or (schedule is not None and not schedule.active))
        return {
            "object": "hermes.job", "id": str(deployment.id), "name": deployment.name, "kind": kind,
            "prompt": params.get("prompt"), "instructions": params.get("instructions"),
            "batch": params.get("settings") if kind == "batch" else None,
            "schedule": getattr(cron, "cron", None), "timezone": getattr(cron, "timezone", None),
            "paused": paused, "state": "paused" if paused else ("scheduled" if schedule else "manual"),
            "description": deployment.description or None,
            "next_run_at": None if paused else _iso(upcoming[0].expected_start_time if upcoming else await _next_date(cron)),
            "last_run": _run_view(last[0]) if last else None,
            "created_at": _iso(deployment.created), "updated_at": _iso(deployment.updated),
            "backend": {"type": "prefect", "deployment_id": str(deployment.id), "work_pool": deployment.work_pool_name,
                        "schedule_id": str(schedule.id) if schedule else None},
        }

    @_translating
    async def list_jobs(self) -> list[dict[str, Any]]:
        async with get_client() as client:
            deployments = await client.read_deployments(
                deployment_filter=DeploymentFilter(tags=DeploymentFilterTags(all_=[JOB_TAG])))
            return [await self._view(client, d) for d in deployments]

    @_translating
    async def get_job(self, job_id: str) -> dict[str, Any]:
        async with get_client() as client:
            return await self._view(client, await self._deployment(client, job_id))

    async def health(self) -> bool:
        async with get_client() as client:
            return await client.api_healthcheck() is None

    # -- changing ----------------------------------------------------------------

    async def _ensure_pool(self, client: PrefectClient) -> None:
        if self._pool_ready:
            return
        try:
            await client.read_work_pool(self.work_pool)
        except ObjectNotFound:
            from prefect.workers.process import ProcessWorker

            try:
                await client.create_work_pool(WorkPoolCreate(
                    name=self.work_pool, type="process", base_job_template=ProcessWorker.get_default_base_job_template()))
                log.info("created the process work pool %r for jobs", self.work_pool)
            except ObjectAlreadyExists:  # a worker starting up made it meanwhile
                pass
        self._pool_ready = True

    @staticmethod
    def _parameters(spec: JobSpec | JobPatch, kind: str, current: dict[str, Any] | None = None) -> dict[str, Any]:
        params = dict(current or {})
        if kind == "prompt":
            for key in ("prompt", "instructions"):
                if key in spec.model_fields_set:
                    params[key] = getattr(spec, key)
        elif spec.batch is not None:
            # each run of a batch job writes its own run folder, named after its start time
            params.update({"settings": spec.batch, "stamp_run_name": True})
        return {k: v for k, v in params.items() if v is not None}

    @_translating
    async def create_job(self, spec: JobSpec) -> dict[str, Any]:
        flow_fn, entrypoint = _flows()[spec.kind]
        async with get_client() as client:
            try:
                await client.read_deployment_by_name(f"{flow_fn.name}/{spec.name}")
                raise JobConflict(f"a job named '{spec.name}' already exists")
            except ObjectNotFound:
                pass
            await self._ensure_pool(client)
            flow_id = await client.create_flow_from_name(flow_fn.name)
            schedules = ([DeploymentScheduleCreate(schedule=CronSchedule(cron=spec.schedule, timezone=spec.timezone),
                                                   active=not spec.paused)] if spec.schedule else [])
            deployment_id = await client.create_deployment(
                flow_id=flow_id, name=spec.name, description=spec.description or "", tags=[JOB_TAG],
                parameters=self._parameters(spec, spec.kind), schedules=schedules, paused=spec.paused,
                work_pool_name=self.work_pool, entrypoint=entrypoint, path=str(REPO),
                # the worker's flow-run process starts in the repo, like prefect.yaml's deployments
                pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}],
                parameter_openapi_schema=parameter_schema(flow_fn).model_dump_for_openapi(),
                enforce_parameter_schema=True)
            return await self._view(client, await client.read_deployment(deployment_id))

    @_translating
    async def update_job(self, job_id: str, patch: JobPatch) -> dict[str, Any]:
        async with get_client() as client:
            deployment = await self._deployment(client, job_id)
            kind = "batch" if deployment.entrypoint.endswith(":batch_run") else "prompt"
            if kind == "batch" and ({"prompt", "instructions"} & patch.model_fields_set):
                raise JobKindMismatch("a batch job has no prompt or instructions: change its batch settings")
            if kind == "prompt" and patch.batch is not None:
                raise JobKindMismatch("a prompt job has no batch settings")
            update: dict[str, Any] = {"parameters": self._parameters(patch, kind, deployment.parameters)}
            if "description" in patch.model_fields_set:
                update["description"] = patch.description or ""
            await client.update_deployment(deployment.id, DeploymentUpdate(**update))
            await self._reschedule(client, deployment, patch)
            if patch.paused is not None:
                await self._set_paused(client, job_id, patch.paused)
            return await self._view(client, await client.read_deployment(deployment.id))

    async def _reschedule(self, client: PrefectClient, deployment, patch: JobPatch) -> None:
        fields = patch.model_fields_set
        if not ({"schedule", "timezone"} & fields):
            return
        current = deployment.schedules[0] if deployment.schedules else None
        if "schedule" in fields and patch.schedule is None:
            for s in deployment.schedules:
                await client.delete_deployment_schedule(deployment.id, s.id)
            return
        cron = patch.schedule or (getattr(current.schedule, "cron", None) if current else None)
        if cron is None:
            raise JobInvalid("this job has no schedule to set a time zone on")
        tz = patch.timezone or (getattr(current.schedule, "timezone", None) if current else None) or "UTC"
        schedule = CronSchedule(cron=cron, timezone=tz)
        if current:
            await client.update_deployment_schedule(deployment.id, current.id, schedule=schedule)
        else:
            await client.create_deployment_schedules(deployment.id, [(schedule, not deployment.paused)])

    async def _set_paused(self, client: PrefectClient, job_id: str, paused: bool) -> None:
        deployment = await self._deployment(client, job_id)
        if paused:
            await client.pause_deployment(deployment.id)
        else:
            await client.resume_deployment(deployment.id)
        for s in deployment.schedules:
            await client.update_deployment_schedule(deployment.id, s.id, active=not paused)

    @_translating
    async def pause_job(self, job_id: str) -> dict[str, Any]:
        async with get_client() as client:
            await self._set_paused(client, job_id, True)
            return await self._view(client, await self._deployment(client, job_id))

    @_translating
    async def resume_job(self, job_id: str) -> dict[str, Any]:
        async with get_client() as client:
            await self._set_paused(client, job_id, False)
            return await self._view(client, await self._deployment(client, job_id))

    @_translating
    async def run_job(self, job_id: str) -> dict[str, Any]:
        async with get_client() as client:
            deployment = await self._deployment(client, job_id)
            flow_run = await client.create_flow_run_from_deployment(deployment.id, tags=[JOB_TAG])
            return {"object": "hermes.job.run", "job_id": job_id, **_run_view(flow_run)}

    @_translating
    async def delete_job(self, job_id: str) -> None:
        async with get_client() as client:
            deployment = await self._deployment(client, job_id)
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(
                deployment_id=FlowRunFilterDeploymentId(any_=[deployment.id]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=IN_FLIGHT))))
            for run in runs:
                # a running flow is asked to stop (its worker kills it); the others never start
                running = run.state is not None and run.state.type == StateType.RUNNING
                await client.set_flow_run_state(run.id, Cancelling() if running else Cancelled(), force=True)
            await client.delete_deployment(deployment.id)


def _stop_process_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:  # a worker that cannot reach its server may hang on exit
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def _next_date(cron: CronSchedule | None) -> datetime | None:
    """When a schedule fires next, before Prefect's scheduler has planned the run."""
    if cron is None:
        return None
    from prefect.server.schemas.schedules import CronSchedule as Planner  # the scheduler's own arithmetic

    dates = await Planner(cron=cron.cron, timezone=cron.timezone, day_or=cron.day_or).get_dates(1)
    return dates[0] if dates else None


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _run_view(flow_run: Any) -> dict[str, Any]:
    state = flow_run.state
    return {"run_id": str(flow_run.id), "name": flow_run.name,
            "state": state.type.value.lower() if state else None, "state_name": state.name if state else None,
            "expected_start_at": _iso(flow_run.expected_start_time), "started_at": _iso(flow_run.start_time),
            "ended_at": _iso(flow_run.end_time)}
