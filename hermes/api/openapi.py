"""The OpenAPI document, saying what the server really answers, so clients generated from it
are right (and schemathesis finds no gap between the two):

- bad input is 400 with the OpenAI error body (FastAPI's default document says 422);
- every operation lists the errors it can give: 401 without the key, 404 for unknown ids,
  409, 413, 429 when the server is full, 502 when the model fails, 503 without jobs;
- streamed answers (text/event-stream) are documented next to the JSON ones.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from hermes.api.security import PUBLIC_PATHS

ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
ERROR_REF = {"$ref": "#/components/schemas/Error"}

WHY = {400: "bad input (the OpenAI error body names the parameter in `param`)",
       401: "missing or wrong API key", 404: "no such object", 409: "conflict with what exists",
       413: "request body too large", 429: "the server runs its maximum of agent runs (see Retry-After)",
       502: "the upstream model failed", 503: "jobs are not available (no Prefect server, or it cannot be reached)"}

#: an agent run: refused when the server is full, and failing when the model does
AGENT = {"/v1/chat/completions": (429, 502), "/v1/responses": (404, 409, 429, 502), "/v1/runs": (404, 429)}

SSE = {"description": "with `stream: true`: server-sent events",
       "schema": {"type": "object"}}


def _errors(path: str, method: str, op: dict[str, Any]) -> set[int]:
    codes: set[int] = set()
    if path not in PUBLIC_PATHS:
        codes.add(401)
    if op.get("requestBody") or op.get("parameters") or method in ("post", "patch"):
        codes |= {400, 413} if method in ("post", "patch") else {400}
    if "{" in path:
        codes.add(404)
    if method == "post":
        codes.add(409)  # an Idempotency-Key reused with another body
    codes |= set(AGENT.get(path, ()) if method == "post" else ())
    if path.startswith("/api/jobs"):
        codes.add(503)
        if method in ("post", "patch"):
            codes.add(409)  # a name taken; a change that does not fit the job's kind
    return codes


def build(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["Error"] = ERROR_SCHEMA
    _add_run_settings(schemas)
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for code in sorted(_errors(path, method, op)):
                responses[str(code)] = {"description": WHY[code],
                                        "content": {"application/json": {"schema": ERROR_REF}}}
            if method == "post" and path in ("/v1/chat/completions", "/v1/responses"):
                ok = responses.setdefault("200", {"description": "the answer"})
                ok.setdefault("content", {})["text/event-stream"] = {"schema": SSE["schema"]}
    return doc


def _add_run_settings(schemas: dict[str, Any]) -> None:
    """A batch job's `batch` is the batch-run settings: their schema, under components."""
    from hermes.settings import RunSettings

    schema = RunSettings.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(schema.pop("$defs", {}))
    schemas["RunSettings"] = schema


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
