"""OpenAI-style errors: every failure answers `{"error": {"message", "type", "param", "code"}}`.

Bad input is a 4xx naming what is wrong (the parameter in `param` where there is one); a 500
only ever means a bug of ours, and even then it carries the same body and security headers.
"""
from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hermes.errors import HermesError

log = logging.getLogger(__name__)

#: added to every response by the security middleware; repeated here for the one response that
#: bypasses all middleware: Starlette's last-resort 500
SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}

_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
          409: "conflict_error", 429: "rate_limit_error"}


def error_type(status: int) -> str:
    if status >= 500:
        return "server_error"
    return _TYPES.get(status, "invalid_request_error")


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


class ApiError(HermesError):
    """Raise anywhere in a handler to answer with an OpenAI-style error."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.status, self.message, self.code, self.param), self.status,
                            headers=self.headers)


def not_found(what: str, ident: str, param: str | None = None) -> ApiError:
    return ApiError(404, f"{what} '{ident}' not found", "not_found", param)


#: loc parts pydantic adds to say which branch of a union it tried: not part of the parameter
_UNION_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _param(loc: tuple[Any, ...]) -> str | None:
    """A parameter path as OpenAI writes it: messages[0].content."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("body", "query", "path", "header") and not out:
            continue
        elif isinstance(part, str) and (part in _UNION_TAGS or part.startswith("constrained-") or "[" in part
                                        or part[:1].isupper()):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or None


def validation_message(exc: RequestValidationError) -> tuple[str, str, str | None]:
    """(message, code, param) for the first problem FastAPI found in a request."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}", "invalid_json", None
    param = _param(tuple(first.get("loc", ())))
    if param is None and first.get("type") in ("model_attributes_type", "dict_type"):
        return "the request body must be a JSON object, sent as Content-Type: application/json", "invalid_request", None
    # a value matching no branch of a union fails once per branch: one message, all branches
    same = [e for e in errors if _param(tuple(e.get("loc", ()))) == param]
    msg = " or ".join(dict.fromkeys(e.get("msg", "invalid") for e in same))
    more = len(errors) - len(same)
    text = (f"{param}: {msg}" if param else msg) + (f" (and {more} more problem(s))" if more else "")
    return text, "invalid_request", param


def _routes(routes: list[Any]):
    for route in routes:
        inner = getattr(route, "original_router", None)  # an included router (FastAPI >= 0.150)
        yield from _routes(inner.routes) if inner is not None else (route,)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route takes at this path. Starlette's 405 names only the first route
    that matched the path (GET /v1/responses/{id} hid DELETE on the same path)."""
    path = request.scope["path"]
    methods: set[str] = set()
    for route in _routes(request.app.router.routes):
        regex, route_methods = getattr(route, "path_regex", None), getattr(route, "methods", None)
        if regex is not None and route_methods and regex.match(path):
            methods |= set(route_methods)
    return sorted(methods)


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, code, param = validation_message(exc)
        return JSONResponse(error_body(400, message, code, param), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI wraps whatever failed while it read the body (our size limit among them).
        if isinstance(exc.__cause__, ApiError):
            return exc.__cause__.response()
        # The router's own answers: unknown paths (404), wrong methods (405), unreadable bodies.
        code = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = (f"no route for {request.method} {request.url.path}" if exc.status_code == 404
                   else str(exc.detail))
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request))
        return JSONResponse(error_body(exc.status_code, message, code), exc.status_code, headers=headers or None)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(500, "internal server error", "internal_error"), 500,
                            headers=SECURITY_HEADERS)
