"""One exception handler family: domain errors → application/problem+json with a `code`.

Bodies never carry stack traces, SQL, hosts or provider bodies; unexpected errors are logged
server-side (with the request path only) and answered with a generic 500.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from db.errors import ALL_UNAVAILABLE_ERRORS
from engine.errors import EngineError, ValidationFailed

log = logging.getLogger(__name__)
PROBLEM = "application/problem+json"
# Where a user adds the key a CREDENTIAL_MISSING refusal asks for.
CREDENTIALS_ROUTE = "POST /api/ai/credentials"
HTTP_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def problem(
    status: int,
    code: str,
    title: str,
    detail: str | None = None,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {"type": "about:blank", "title": title, "status": status, "code": code}
    body["detail"] = detail or title
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def _clean_errors(errors: Any) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        out.append(
            {
                "loc": [str(p) for p in e.get("loc", ())],
                "msg": str(e.get("msg", "")),
                "type": str(e.get("type", "")),
            }
        )
    return out[:50]


def _literal_methods(app: FastAPI, path: str) -> list[str] | None:
    """The methods OpenAPI lists for `path` when it is one of its literal paths (no template),
    else None."""
    ops = app.openapi().get("paths", {}).get(path)
    if not isinstance(ops, dict):
        return None
    return [m for m in HTTP_METHODS if m.lower() in ops]


class LiteralPathMethods:
    """A method a literal path does not serve is 405 with `Allow`, as for any other path.

    Without it, `GET /api/ai/jobs/quote` would reach the `/api/ai/jobs/{jobId}` template (a
    job id that is not a UUID: 422), so a literal resource would answer methods OpenAPI does not
    list for it. A CORS preflight and `HEAD` where `GET` is served go on to the router."""

    def __init__(self, app: ASGIApp, api: FastAPI) -> None:
        self.app, self.api = app, api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method = str(scope["method"])
            allowed = _literal_methods(self.api, str(scope.get("path", "")))
            headers = {k.lower() for k, _ in scope.get("headers", ())}
            passes = (method == "OPTIONS" and b"access-control-request-method" in headers) or (
                method == "HEAD" and allowed is not None and "GET" in allowed
            )
            if allowed is not None and method not in allowed and not passes:
                title = "Method Not Allowed"
                headers_out = {"Allow": ", ".join(allowed)}
                response = problem(405, "METHOD_NOT_ALLOWED", title, title, headers=headers_out)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (the router names only the first route's).
    Each method is tried against the routes as the router would: included routers are not
    flat lists of routes, so a route's `methods` cannot simply be read."""
    # A path that OpenAPI lists literally (`/api/ai/jobs/quote`) is that resource, and its
    # methods are the ones listed there: a template that would also match it
    # (`/api/ai/jobs/{jobId}`) is another resource.
    literal = _literal_methods(request.app, str(request.scope.get("path", "")))
    if literal is not None:
        return ", ".join(literal)
    routes = request.app.router.routes
    allowed = [
        method
        for method in HTTP_METHODS
        if any(r.matches({**request.scope, "method": method})[0] is Match.FULL for r in routes)
    ]
    return ", ".join(allowed)


def install(app: FastAPI) -> None:
    app.add_middleware(LiteralPathMethods, api=app)

    @app.exception_handler(EngineError)
    async def engine_error(request: Request, exc: EngineError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
        extra: dict[str, Any] = {}
        if isinstance(exc, ValidationFailed) and exc.errors:
            extra["errors"] = exc.errors
        # Members a refusal needs to be acted on (a bulk filter's match count and limit).
        extra.update(getattr(exc, "problem_extra", {}))
        message = exc.public_message
        if exc.code == "CREDENTIAL_MISSING" and CREDENTIALS_ROUTE not in message:
            message = f"{message} Add your key with {CREDENTIALS_ROUTE}."
        if exc.http_status == 401:
            headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
        return problem(exc.http_status, exc.code, exc.title, message, headers=headers, **extra)

    @app.exception_handler(RequestValidationError)
    async def request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return problem(
            422,
            "VALIDATION_FAILED",
            "Validation failed",
            "The request is invalid.",
            errors=_clean_errors(exc.errors()),
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 400: "BAD_REQUEST"}
        code = codes.get(exc.status_code, "HTTP_ERROR")
        detail = exc.detail if isinstance(exc.detail, str) else None
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": _allowed_methods(request)}
        return problem(
            exc.status_code,
            code,
            detail or code.replace("_", " ").title(),
            detail,
            headers=headers,
        )

    async def db_down(request: Request, exc: Exception) -> JSONResponse:
        log.error("database unavailable on %s", request.url.path)
        return problem(
            503,
            "SERVICE_UNAVAILABLE",
            "Service unavailable",
            "The service is temporarily unavailable.",
            headers={"Retry-After": "5"},
        )

    # Which driver errors mean "the database is unavailable" is decided in db/errors.py.
    for unavailable in ALL_UNAVAILABLE_ERRORS:
        app.exception_handler(unavailable)(db_down)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return problem(500, "INTERNAL_ERROR", "Internal error", "An internal error occurred.")
