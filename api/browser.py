"""What a web page needs to use the API: CORS for the configured origins, and stream tokens.

An `EventSource` cannot send an `Authorization` header, so a page follows a job with a short-lived
*stream token* in the query string (`?streamToken=`). Query strings end up in access logs and
browser history, so a stream token is made to be worth little if it leaks:

- it lives at most `STREAM_TOKEN_TTL_S` seconds;
- it is signed with a key derived from the JWT secret for this purpose only, and carries its own
  audience and `typ`: it is never a bearer token (refused on every other route, 401), and a
  bearer token is never a stream token;
- it opens only the `GET .../events` routes, and only for its user's own jobs (another user's
  job is 401 for it, not 404: an admin's bearer may follow anyone's job, a stream token may not);
- the access log redacts it (`RedactStreamToken`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import re
import secrets
import time
from typing import Any

import jwt
from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from api.auth import JwtConfig, Principal
from engine.errors import Unauthenticated
from engine.settings import Settings

STREAM_TOKEN_TTL_S = 300
STREAM_AUDIENCE = "aijobs:stream-token"
STREAM_TYP = "stream"
STREAM_TOKEN_PARAM = "streamToken"
_INVALID = "The stream token is invalid, expired, or not valid for this stream."
_TOKEN_IN_QUERY = re.compile(r"(streamToken=)[^&\s\"]*", re.IGNORECASE)
CORS_METHODS = ("GET", "POST", "DELETE")
CORS_HEADERS = ("Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID")
CORS_EXPOSED = ("Location", "Retry-After", "WWW-Authenticate")


class StreamPrincipal(Principal):
    """A principal authenticated by a stream token: never an admin, own jobs only."""


def _key(cfg: JwtConfig) -> bytes:
    """A key for stream tokens only: a bearer's signature never verifies as one, and back."""
    return hmac.new(cfg.secret.encode(), b"aijobs stream token v1", hashlib.sha256).digest()


def issue_stream_token(cfg: JwtConfig, user_id: str) -> tuple[str, dt.datetime]:
    now = int(time.time())
    exp = now + STREAM_TOKEN_TTL_S
    claims: dict[str, Any] = {
        "sub": user_id,
        "aud": STREAM_AUDIENCE,
        "typ": STREAM_TYP,
        "iat": now,
        "exp": exp,
        "jti": secrets.token_urlsafe(12),
    }
    token = jwt.encode(claims, _key(cfg), algorithm="HS256")
    return token, dt.datetime.fromtimestamp(exp, dt.UTC)


def verify_stream_token(cfg: JwtConfig, token: str) -> StreamPrincipal:
    try:
        claims = jwt.decode(
            token,
            _key(cfg),
            algorithms=["HS256"],
            audience=STREAM_AUDIENCE,
            options={"require": ["sub", "aud", "typ", "iat", "exp"]},
            leeway=0,
        )
    except jwt.PyJWTError:
        raise Unauthenticated(_INVALID) from None
    sub, iat, exp = claims.get("sub"), claims.get("iat"), claims.get("exp")
    if claims.get("typ") != STREAM_TYP or not isinstance(sub, str) or not sub:
        raise Unauthenticated(_INVALID)
    if not isinstance(iat, int) or not isinstance(exp, int) or exp - iat > STREAM_TOKEN_TTL_S:
        raise Unauthenticated(_INVALID)
    return StreamPrincipal(user_id=sub, roles=frozenset())


def misused() -> Unauthenticated:
    return Unauthenticated(_INVALID)


class RedactStreamToken(logging.Filter):
    """Blanks `streamToken=...` in a log record's message and arguments (uvicorn's access log
    passes the request line as an argument)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "streamtoken" in record.msg.lower():
            record.msg = _TOKEN_IN_QUERY.sub(r"\1[redacted]", record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(
                _TOKEN_IN_QUERY.sub(r"\1[redacted]", a) if isinstance(a, str) else a
                for a in record.args
            )
        return True


def redact_access_log() -> None:
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactStreamToken) for f in logger.filters):
            logger.addFilter(RedactStreamToken())


class _Cors(CORSMiddleware):
    """Starlette's CORS, with a preflight answered 204 No Content (it has no body to give)."""

    def preflight_response(self, request_headers: Any) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 200:
            return response
        headers = {
            k: v
            for k, v in response.headers.items()
            if k.lower() not in ("content-length", "content-type")
        }
        return Response(status_code=204, headers=headers)


def cors_origins(settings: Settings) -> list[str]:
    return [o.strip().rstrip("/") for o in settings.cors_allow_origins.split(",") if o.strip()]


def install(app: FastAPI, settings: Settings) -> None:
    """CORS for CORS_ALLOW_ORIGINS (none: no CORS headers at all), and the access-log filter.
    Added last, so it wraps everything: a refusal (401, 413, 429) carries CORS headers too,
    and a browser can read why it was refused."""
    redact_access_log()
    origins = cors_origins(settings)
    if origins:
        app.add_middleware(
            _Cors,
            allow_origins=origins,
            allow_methods=list(CORS_METHODS),
            allow_headers=list(CORS_HEADERS),
            expose_headers=list(CORS_EXPOSED),
            max_age=600,
        )
