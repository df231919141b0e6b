"""How the console answers: HTML from the package's Jinja2 templates (autoescaped), the headers
every /console answer carries, and the route class that keeps console routes out of the JSON
API's error handling.

Every answer under /console (pages, redirects, refusals, static files) carries a
Content-Security-Policy that allows scripts, styles, images and fonts from the API itself only
(no `'unsafe-inline'`), forbids framing, and `Cache-Control: no-store`. Only /console answers:
Swagger UI at /docs keeps its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.console.csrf import CsrfRefused
from api.console.sessions import LOGIN_PATH, ConsoleSession, SignInNeeded
from api.strict import HtmlRoute
from db.errors import is_unavailable
from engine.errors import EngineError, ValidationFailed
from jobs.views import usd_text

log = logging.getLogger(__name__)
PREFIX = "/console"
HERE = Path(__file__).parent
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "font-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'; object-src 'none'"
)
HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # The Temporal UI link gets no Referer; the console's own pages do (an error's way back).
    (b"referrer-policy", b"same-origin"),
)
_REPLACED = frozenset(name for name, _ in HEADERS)


def is_console(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class ConsoleHeaders:
    """Pure ASGI: adds HEADERS to every answer under /console (and to nothing else)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_console(str(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _REPLACED]
                message = {**message, "headers": [*kept, *HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _when(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _usd(value: Decimal | None) -> str:
    return "" if value is None else usd_text(value)


_env = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["when"] = _when
_env.filters["usd"] = _usd


def page(
    request: Request,
    template: str,
    *,
    title: str,
    session: ConsoleSession | None,
    section: str = "",
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    html = _env.get_template(template).render(
        title=title, session=session, section=section, path=request.url.path, **context
    )
    return HTMLResponse(html, status_code=status_code)


def see_other(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def _back(request: Request) -> str:
    """Where an error page's way back leads: the console page the request came from (the
    Referer, same-origin only by the policy above), else the jobs page."""
    referer = urlsplit(request.headers.get("referer", ""))
    if referer.netloc == request.url.netloc and is_console(referer.path):
        return referer.path + (f"?{referer.query}" if referer.query else "")
    return f"{PREFIX}/jobs"


def error_page(request: Request, status_code: int, code: str, message: str) -> HTMLResponse:
    session = getattr(request.state, "console", None)
    return page(
        request,
        "error.html",
        title="Refused" if status_code < 500 else "Error",
        session=session,
        status_code=status_code,
        code=code,
        message=message,
        back=_back(request),
    )


class ConsoleRoute(HtmlRoute):
    """A console route: outside the JSON API's strictness (api/strict.py skips it), and its
    refusals are HTML pages: no session → 303 to the sign-in form, no CSRF token → 403, a
    domain refusal → its status with its code and public message, a malformed request → 400,
    the database away → 503, anything else → 500 (logged, nothing internal shown)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInNeeded:
                return see_other(LOGIN_PATH)
            except CsrfRefused:
                message = "This action needs the form's CSRF token: reload the page and retry."
                return error_page(request, 403, "CSRF_TOKEN_MISSING", message)
            except EngineError as exc:
                status = 400 if isinstance(exc, ValidationFailed) else exc.http_status
                return error_page(request, status, exc.code, exc.public_message)
            except RequestValidationError:
                return error_page(request, 400, "BAD_REQUEST", "The request is malformed.")
            except Exception as exc:
                # As the JSON API answers them (api/errors.py), as a page: nothing internal shown.
                if is_unavailable(exc):
                    log.error("database unavailable on %s", request.url.path)
                    message = "The service is temporarily unavailable."
                    return error_page(request, 503, "SERVICE_UNAVAILABLE", message)
                log.exception("unhandled error on %s", request.url.path)
                return error_page(request, 500, "INTERNAL_ERROR", "An internal error occurred.")

        return run
