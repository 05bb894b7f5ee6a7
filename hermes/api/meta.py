"""Discovery and health: /v1/models, /v1/capabilities, /health, /v1/health, /health/detailed.

/health is a cheap liveness probe (public). /health/detailed is a readiness report behind the
key: states and counts only, never configuration values, credentials, paths or payloads. A
degraded server still answers 200: read `status` and `readiness.checks`.
"""
from __future__ import annotations

import shutil
import time

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from hermes.api.errors import not_found

router = APIRouter()

STARTED = int(time.time())
#: below this much free space where responses are stored, the disk check says "low"
MIN_FREE_BYTES = 100 << 20


def _model(request: Request) -> dict:
    return {"id": request.app.state.settings.model_name, "object": "model", "created": STARTED,
            "owned_by": "hermes-batch"}


@router.get("/v1/models")
async def list_models(request: Request):
    return {"object": "list", "data": [_model(request)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request):
    if model_id != request.app.state.settings.model_name:
        raise not_found("model", model_id, "model")
    return _model(request)


@router.get("/v1/capabilities")
async def capabilities(request: Request):
    state = request.app.state
    s = state.settings
    return {
        "object": "hermes.api_server.capabilities",
        "platform": "hermes-agent",
        "model": s.model_name,
        "auth": {"type": "bearer", "required": s.key_value() is not None},
        "features": {
            "chat_completions": True, "responses_api": True, "run_submission": True, "run_status": True,
            "run_events_sse": True, "run_stop": True, "streaming": True, "stored_responses": True,
            "named_conversations": True, "idempotency_keys": True, "image_input": True, "file_input": False,
            "jobs": state.jobs is not None,
        },
        "tools": [t["function"]["name"] for t in state.service.tools],
        "limits": {"max_concurrent_runs": s.max_concurrent_runs, "max_request_bytes": s.max_request_bytes,
                   "max_stored_responses": s.max_stored_responses},
    }


@router.get("/health")
@router.get("/v1/health")
async def health():
    return {"status": "ok"}


@router.get("/health/detailed")
async def health_detailed(request: Request):
    state = request.app.state
    checks = {
        "response_store": {"status": "ok", **state.store.counts()},
        "model": {"status": "configured"},
        "sandbox": {"status": "ok" if await run_in_threadpool(state.service.backend.available) else "unavailable",
                    "backend": state.service.sandbox.backend},
        "disk": {"status": "ok" if shutil.disk_usage(state.settings.store_path.parent).free > MIN_FREE_BYTES else "low"},
        "jobs": {"status": "disabled" if state.jobs is None
                 else ("ok" if await _jobs_ok(state.jobs) else "unavailable")},
    }
    degraded = any(c["status"] not in ("ok", "configured", "disabled") for c in checks.values())
    return {"object": "hermes.health.detailed", "status": "degraded" if degraded else "ok",
            "uptime_seconds": int(time.time()) - STARTED,
            "readiness": {"checks": checks},
            "runs": state.runs.counts(),
            "agent_runs": state.service.counts()}


async def _jobs_ok(jobs) -> bool:
    try:
        return bool(await jobs.health())
    except Exception:  # noqa: BLE001 - any failure is "unavailable"; the reason may hold addresses
        return False
