"""Signing in and out of the console, and its front door.

- `GET /console`: 303 to the jobs page (which sends a visitor without a session on to the
  sign-in form).
- `GET /console/login`: the form, one field labelled "Admin token".
- `POST /console/login`: a token the API accepts, with SUPER_ADMIN: 303 to the jobs page with
  the session cookie. A valid token without SUPER_ADMIN: 403 and the form again; an invalid or
  expired one: 401 and the form again. Neither creates a session. A sign-in POSTed from another
  site (`Sec-Fetch-Site: cross-site`) is refused (403): a page elsewhere cannot sign a browser
  in to a session it chose.
- `POST /console/logout` (CSRF-checked): the session row is deleted (every API process sees it
  gone) and the cookie cleared.
"""

from __future__ import annotations

import secrets

from fastapi import APIRouter, Request
from starlette.responses import Response

from api.console import sessions
from api.console.csrf import Action
from api.console.render import ConsoleRoute, page, see_other
from engine.errors import Forbidden, Unauthenticated

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)
JOBS = "/console/jobs"
_CROSS_SITE = "A sign-in must come from the console's own form."


def _form_page(request: Request, status_code: int = 200, error: str | None = None) -> Response:
    return page(
        request,
        "login.html",
        title="Sign in",
        session=None,
        section="login",
        status_code=status_code,
        error=error,
    )


@router.get("")
@router.get("/")
async def front_door() -> Response:
    return see_other(JOBS)


@router.get("/login")
async def login_form(request: Request) -> Response:
    return _form_page(request)


async def _token_of(request: Request) -> str:
    try:
        value = (await request.form()).get("token")
    except Exception:  # a body that is no form carries no token
        return ""
    return value if isinstance(value, str) else ""


@router.post("/login")
async def login(request: Request) -> Response:
    if request.headers.get("sec-fetch-site", "").lower() == "cross-site":
        return _form_page(request, 403, _CROSS_SITE)
    session_id = secrets.token_urlsafe(32)
    try:
        _, expires_at, now = await sessions.sign_in(
            sessions.state_of(request),
            await _token_of(request),
            session_id,
            replaces=request.cookies.get(sessions.COOKIE),
        )
    except (Unauthenticated, Forbidden) as exc:
        return _form_page(request, exc.http_status, exc.public_message)
    response = see_other(JOBS)
    sessions.set_cookie(response, request, session_id, expires_at, now)
    return response


@router.post("/logout")
async def logout(request: Request, _session: Action) -> Response:
    session_id = request.cookies.get(sessions.COOKIE, "")
    await sessions.sign_out(sessions.state_of(request), session_id)
    response = see_other(sessions.LOGIN_PATH)
    sessions.clear_cookie(response, request)
    return response
