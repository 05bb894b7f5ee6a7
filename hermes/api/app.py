"""The FastAPI application: routers, errors, and the outer layers in their order.

    create_app(settings, jobs=None) -> FastAPI

Outermost first, every request passes: security headers (so every answer has them, errors
and preflights included) -> CORS (only with an allowlist) -> the API key -> the body size
limit -> Idempotency-Key replay -> the routes.
"""
from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from hermes.api import chat, errors, jobs as jobs_api, meta, openapi, responses, runs
from hermes.api.idempotency import Idempotency
from hermes.api.jobs import JobsBackend
from hermes.api.runs import RunRegistry
from hermes.api.security import BearerAuth, BodyLimit, Cors, SecurityHeaders
from hermes.api.service import AgentService
from hermes.api.server_settings import ApiSettings, check_bind
from hermes.api.response_store import ResponseStore


def create_app(settings: ApiSettings, jobs: JobsBackend | None = None) -> FastAPI:
    # Checked here as well as at the command line: whatever serves this app, never expose
    # terminal access without a key.
    check_bind(settings.host, settings.key_value())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        service = AgentService(settings)
        store = ResponseStore(settings.store_path, settings.max_stored_responses)
        registry = RunRegistry(service, settings.run_events_ttl, settings.run_retention)
        app.state.service, app.state.store, app.state.runs = service, store, registry
        await run_in_threadpool(service.reap_orphans)
        if jobs is not None:
            await jobs.start()
        sweeper = asyncio.create_task(registry.sweeper())
        try:
            yield
        finally:
            # Here, not after uvicorn returns: on SIGTERM uvicorn re-raises the signal once the
            # app has shut down, and the process ends without running anything else.
            sweeper.cancel()
            await service.aclose()  # stops runs in flight and waits until their sandboxes are gone
            store.close()
            if jobs is not None:
                await jobs.close()

    app = FastAPI(title="hermes-batch API server", version="1", lifespan=lifespan,
                  docs_url=None, redoc_url=None)  # the OpenAPI document stays, behind the key
    app.state.settings, app.state.jobs = settings, jobs
    errors.install(app)
    openapi.install(app)
    for module in (chat, responses, runs, jobs_api, meta):
        app.include_router(module.router)
    # add_middleware puts each new layer outside the previous ones: innermost first.
    app.add_middleware(Idempotency, ttl=settings.idempotency_ttl)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(BearerAuth, key=settings.key_value())
    if settings.cors_origins:
        app.add_middleware(Cors, origins=settings.cors_origins)
    app.add_middleware(SecurityHeaders)
    return app
