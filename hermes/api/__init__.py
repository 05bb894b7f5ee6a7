"""The OpenAI-compatible API server over the agent (SPEC §3): any OpenAI-format client uses
the agent, with its tools and sandboxes, as a model.

    app.py          create_app(): routers, errors, middleware order, lifespan
    server_settings.py  API_SERVER_* environment over the config file
    security.py     security headers, CORS, API key, body size limit
    idempotency.py  Idempotency-Key replay
    errors.py       OpenAI-style error bodies
    openapi.py      the OpenAPI document as the server answers (400s, every error, SSE)
    wire_schemas.py JSON Schemas of request bodies: the rules content.py enforces, for clients
    service.py      the agent behind it: worker threads, a sandbox per request, the run cap
    content.py      client messages and Responses input -> chat messages
    chat.py         /v1/chat/completions
    responses.py    /v1/responses (+ response_store.py: stored responses in SQLite)
    runs.py         /v1/runs
    jobs.py         /api/jobs over a JobsBackend (the Prefect one is flows/scheduled_jobs.py)
    meta.py         models, capabilities, health
    server.py       serving with uvicorn (its own 400s with security headers, keep-alive)

No Prefect here: `hermes-batch serve` (flows/serve.py) wires the Prefect jobs backend in.
"""
from hermes.api.app import create_app
from hermes.api.server_settings import ApiSettings

__all__ = ["create_app", "ApiSettings"]
