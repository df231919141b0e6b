"""Console sessions: a sign-in with an admin token becomes a session in PostgreSQL, held by the
browser as an opaque id in a cookie.

- The cookie holds `secrets.token_urlsafe(32)`; the table holds its SHA-256 (`db/console_
  sessions.py`), so a read of the table is no cookie. Every API process reads the same table:
  a sign-out ends the session everywhere, and a copied cookie dies with it. A session is not
  bound to a User-Agent or an address.
- A session lasts CONSOLE_SESSION_TTL_S and never outlives the token's `exp` (the database's
  clock decides both ends).
- The cookie is `Path=/console; HttpOnly; SameSite=Strict`, plus `Secure` when the request's
  scheme, as uvicorn sees it (its proxy-headers settings decide behind a proxy), is https. It
  authenticates console pages only: the JSON API reads `Authorization` alone, and the console
  reads this cookie alone (a bearer header is no session).
- Each session has a CSRF token, an HMAC of its id under a key derived from the JWT secret for
  this purpose only (`api/console/csrf.py` checks it).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import jwt
from fastapi import Depends, Request
from starlette.responses import Response

from api.auth import ADMIN_ROLE, JwtConfig, Principal, verify_token
from api.state import AppState
from db import console_sessions as console_sessions_db
from engine.errors import Forbidden, Unauthenticated
from engine.settings import Settings

COOKIE = "aijobs_console"
COOKIE_PATH = "/console"
LOGIN_PATH = "/console/login"
# A pasted token longer than this is no token the API issues (refused before any parsing).
MAX_TOKEN_CHARS = 8192
_INVALID = "The token is invalid or expired."
_NOT_ADMIN = "An admin token is needed: this token does not carry the SUPER_ADMIN role."


class SignInNeeded(Exception):
    """No valid console session: the page answers 303 to the sign-in form."""


@dataclass(frozen=True)
class ConsoleSession:
    """A signed-in admin: the principal every admin use case is called with, and the CSRF
    token each of the session's forms carries."""

    admin: Principal
    csrf: str
    expires_at: datetime


def state_of(request: Request) -> AppState:
    state: AppState = request.app.state.aijobs
    return state


def id_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def _csrf_key(settings: Settings) -> bytes:
    """A key for CSRF tokens only, derived from the JWT secret (as stream tokens' is)."""
    secret = settings.jwt_signing_secret.encode()
    return hmac.new(secret, b"aijobs console csrf v1", hashlib.sha256).digest()


def csrf_token(settings: Settings, session_id: str) -> str:
    return hmac.new(_csrf_key(settings), session_id.encode(), hashlib.sha256).hexdigest()


def admin_of(settings: Settings, token: str) -> tuple[Principal, datetime]:
    """The admin a pasted token stands for and its `exp`: Unauthenticated (401) for a token
    the API refuses, Forbidden (403) for a valid one without SUPER_ADMIN."""
    token = token.strip()
    if not token or len(token) > MAX_TOKEN_CHARS:
        raise Unauthenticated(_INVALID)
    try:
        principal = verify_token(JwtConfig.from_settings(settings), f"Bearer {token}")
    except Unauthenticated:
        raise Unauthenticated(_INVALID) from None
    # Verified above: its `exp` is a number. Read without the leeway, the session's end.
    exp = float(jwt.decode(token, options={"verify_signature": False})["exp"])
    if exp <= time.time():
        raise Unauthenticated(_INVALID)
    if not principal.is_admin:
        raise Forbidden(_NOT_ADMIN)
    return principal, datetime.fromtimestamp(exp, UTC)


async def sign_in(
    state: AppState, token: str, session_id: str, *, replaces: str | None = None
) -> tuple[str, datetime, datetime]:
    """A new session for `session_id` (the caller's fresh random id): (admin, expires_at,
    now). Refusals create nothing. The browser's previous session (`replaces`, its cookie)
    ends with it; expired sessions are deleted on the way, a batch at most."""
    principal, exp = admin_of(state.settings, token)
    async with state.sessionmaker.begin() as s:
        await console_sessions_db.purge_expired(s)
        if replaces:
            await console_sessions_db.delete(s, id_hash(replaces))
        expires_at, now = await console_sessions_db.insert(
            s,
            id_hash(session_id),
            principal.user_id,
            ttl_s=state.settings.console_session_ttl_s,
            token_exp=exp,
        )
    return principal.user_id, expires_at, now


async def sign_out(state: AppState, session_id: str) -> None:
    async with state.sessionmaker.begin() as s:
        await console_sessions_db.delete(s, id_hash(session_id))


async def current(request: Request) -> ConsoleSession | None:
    """The request's console session, from its cookie alone."""
    session_id = request.cookies.get(COOKIE)
    if not session_id or len(session_id) > 128:
        return None
    state = state_of(request)
    async with state.sessionmaker() as s:
        found = await console_sessions_db.find(s, id_hash(session_id))
    if found is None:
        return None
    user_id, expires_at = found
    admin = Principal(user_id=user_id, roles=frozenset({ADMIN_ROLE}))
    return ConsoleSession(admin, csrf_token(state.settings, session_id), expires_at)


async def console_admin(request: Request) -> ConsoleSession:
    """A console page's dependency: the signed-in admin, else 303 to the sign-in form."""
    session = await current(request)
    if session is None:
        raise SignInNeeded
    request.state.console = session  # the error pages' navigation shows the sign-out
    return session


Console = Annotated[ConsoleSession, Depends(console_admin)]


def set_cookie(
    response: Response, request: Request, session_id: str, expires_at: datetime, now: datetime
) -> None:
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=max(0, int((expires_at - now).total_seconds())),
        path=COOKIE_PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def clear_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(
        COOKIE,
        path=COOKIE_PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
