"""Bounded input before anything else: a request body over MAX_REQUEST_BYTES is refused with 413;
and a user's creates and quotes past their rate are refused with 429 before any costly work
(`RateLimitedUser`, the end of this module).

The limit wraps the whole application, Starlette's own error middleware included, so an oversized
body costs neither JSON parsing nor a token check, and no route can forget it:

- a `Content-Length` over the limit is answered before one byte of the body is read;
- a body without one (chunked), or longer than its `Content-Length`, is counted as it streams and
  cut off as soon as the count passes the limit. Nothing is buffered: the app receives each chunk
  as it arrives, so a request never holds more than the limit in memory.

After the refusal is sent, the rest of the body is read and thrown away, for at most
`DRAIN_MAX_BYTES` and `DRAIN_MAX_SECONDS`, before the connection is closed (`Connection: close`).
Closing at once would be cheaper but loses the answer: a socket closed with unread input sends a
TCP reset, and a client still writing its body (httpx, for one) then gets a connection error
instead of the 413. Without the bounds, a client could keep a refused connection busy forever.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import Principal
from api.deps import State, User
from api.errors import PROBLEM, problem
from engine.errors import PayloadTooLarge
from jobs.rate_limit import take_request

log = logging.getLogger(__name__)

# Past it: 413. Room for a job whose `input` is at its bound (api/schemas.py MAX_INPUT_BYTES,
# 1.5 MiB: a source of 400,000 characters in UTF-8), twice over for \u-escaped text.
MAX_REQUEST_BYTES = 3 * 1024 * 1024
DRAIN_MAX_BYTES = 64 * 1024 * 1024
DRAIN_MAX_SECONDS = 10.0

_DISCONNECT: Message = {"type": "http.disconnect"}
_CLOSE = {"Connection": "close"}


def problem_schema(title: str, status: str, code: str, detail: str) -> dict[str, Any]:
    """The OpenAPI schema of one problem+json answer, its fields described as this answer
    fills them (`title`, `status`, `code`, `detail` are those descriptions)."""
    return {
        "type": "object",
        "required": ["type", "title", "status", "code", "detail"],
        "properties": {
            "type": {"type": "string", "title": "Type", "description": "Always `about:blank`"},
            "title": {"type": "string", "title": "Title", "description": title},
            "status": {"type": "integer", "title": "Status", "description": status},
            "code": {"type": "string", "title": "Code", "description": code},
            "detail": {"type": "string", "title": "Detail", "description": detail},
        },
    }


_PROBLEM_SCHEMA = problem_schema(
    "Request body too large", "413", "`PAYLOAD_TOO_LARGE`", "The limit, in bytes"
)
# `responses=` entry for every route that takes a body (the limit itself applies to all routes).
TOO_LARGE_RESPONSE: dict[int | str, dict[str, Any]] = {
    413: {
        "description": "The body exceeds 3 MiB (`PAYLOAD_TOO_LARGE`); checked "
        "before authentication",
        "content": {PROBLEM: {"schema": _PROBLEM_SCHEMA}},
    }
}


def too_large(max_bytes: int) -> JSONResponse:
    exc = PayloadTooLarge(f"The request body must not exceed {max_bytes} bytes.")
    return problem(exc.http_status, exc.code, exc.title, exc.public_message, headers=_CLOSE)


def _length_mismatch() -> JSONResponse:
    detail = "The request body is longer than its Content-Length."
    return problem(400, "BAD_REQUEST", "Bad request", detail, headers=_CLOSE)


def declared_length(scope: Scope) -> int | None:
    """The body length a request announces, or None when it announces none we can trust: no
    header, a chunked body (Transfer-Encoding overrides Content-Length), or a malformed value
    (the server's HTTP parser normally refuses those before we run; counting still protects)."""
    values: list[bytes] = []
    for name, value in scope["headers"]:
        name = name.lower()
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            values.append(value.strip())
    if not values or any(v != values[0] for v in values):
        return None
    if not (values[0].isdigit() and len(values[0]) <= 19):
        return None
    return int(values[0])


def _expects_continue(scope: Scope) -> bool:
    return any(
        name.lower() == b"expect" and value.strip().lower() == b"100-continue"
        for name, value in scope["headers"]
    )


class BodySizeLimit:
    """Pure ASGI middleware: refuses request bodies larger than `max_bytes` with a 413 problem."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        drain_bytes: int = DRAIN_MAX_BYTES,
        drain_seconds: float = DRAIN_MAX_SECONDS,
    ) -> None:
        if max_bytes < 0 or drain_bytes < 0 or drain_seconds < 0:
            raise ValueError("limits must not be negative")
        self.app = app
        self.max_bytes = max_bytes
        self.drain_bytes = drain_bytes
        self.drain_seconds = drain_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            # The app never runs. The answer goes out before the body is read (uvicorn sends
            # `100 Continue` only when the body is first asked for, so a client that waits for
            # it never sends the body at all and there is nothing to drain).
            drain = declared <= self.drain_bytes and not _expects_continue(scope)
            await self.refuse(too_large(self.max_bytes), receive, send, drain=drain)
            return
        await _BoundedRequest(self, declared, scope, receive, send).run()

    async def refuse(
        self, response: JSONResponse, receive: Receive, send: Send, *, drain: bool
    ) -> None:
        """Sends `response` whole at once; then, if `drain`, discards what is left of the request
        body within the drain bounds before the last (empty) message lets the server close."""
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": response.raw_headers,
            }
        )
        # The body is complete for the client (it carries a Content-Length); `more_body` only
        # keeps the exchange open on the server's side so that receive() still yields the body.
        await send({"type": "http.response.body", "body": response.body, "more_body": drain})
        if not drain:
            return
        await self._discard_body(receive)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _discard_body(self, receive: Receive) -> None:
        left = self.drain_bytes
        try:
            async with asyncio.timeout(self.drain_seconds):
                while left >= 0:
                    message = await receive()
                    if message["type"] != "http.request":
                        return  # the client went away
                    if not message.get("more_body", False):
                        return
                    left -= len(message.get("body", b""))
        except TimeoutError:
            pass


class _BoundedRequest:
    """One request under the limit. Once refused, the app is told the client left (the only
    way ASGI has to stop a reader) and whatever it sends afterwards is dropped: the client already
    has its answer, or, if the app had started its response first, must not get one that looks
    complete (the server closes the connection when the app returns without finishing it)."""

    def __init__(
        self, limit: BodySizeLimit, declared: int | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        self.limit = limit
        self.declared = declared
        self.scope = scope
        self._receive = receive
        self._send = send
        self.received = 0
        self.response_started = False
        self.refused = False
        self.answered = False

    async def run(self) -> None:
        try:
            await self.limit.app(self.scope, self.receive, self.send)
        except Exception:
            if not self.answered:
                raise
            # A consequence of the disconnect reported to the app after the client got its
            # refusal: re-raising would only log a misleading traceback.
            log.debug("app raised after its request body was refused", exc_info=True)

    async def receive(self) -> Message:
        if self.refused:
            return _DISCONNECT
        message = await self._receive()
        if message["type"] != "http.request":
            return message
        self.received += len(message.get("body", b""))
        if self.received > self.limit.max_bytes:
            refusal = too_large(self.limit.max_bytes)
        elif self.declared is not None and self.received > self.declared:
            refusal = _length_mismatch()
        else:
            return message
        # No await between reading `response_started` (which `send` sets before it awaits) and
        # setting `refused`: the app cannot slip its own response start in between.
        self.refused = True
        if self.response_started:
            log.warning(
                "request body over the limit after the response started; response abandoned",
                extra={"path": self.scope.get("path")},
            )
        else:
            self.answered = True
            more = bool(message.get("more_body", False))
            await self.limit.refuse(refusal, self._receive, self._send, drain=more)
        return _DISCONNECT

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        if message["type"] == "http.response.start":
            self.response_started = True
        await self._send(message)


def install(app: FastAPI, *, max_bytes: int) -> None:
    """Makes `BodySizeLimit` the outermost layer of `app`, outside Starlette's error middleware
    and any middleware added with `add_middleware`, whatever the order of installation."""
    build_stack = app.build_middleware_stack

    def build_limited_stack() -> ASGIApp:
        return BodySizeLimit(build_stack(), max_bytes=max_bytes)

    app.build_middleware_stack = build_limited_stack  # type: ignore[method-assign]


# ---- the per-user request rate ------------------------------------------------------------------

_RATE_LIMITED_SCHEMA = problem_schema(
    "Too many requests", "429", "`RATE_LIMITED`", "The limit and what to do"
)
RATE_LIMITED_RESPONSE: dict[int | str, dict[str, Any]] = {
    429: {
        "description": "Past your request rate (`RATE_LIMITED`: creates, quotes, retries, a "
        "schedule's create, resume and trigger share it; API_RATE_LIMIT_PER_MINUTE with bursts of "
        "API_RATE_LIMIT_BURST, across all API processes), or this server's "
        "token counting busy for too long; `Retry-After` in whole seconds, at least 1",
        "content": {PROBLEM: {"schema": _RATE_LIMITED_SCHEMA}},
    }
}


async def rate_limited_user(state: State, principal: User) -> Principal:
    """The caller, once one request has been taken from its rate (jobs/rate_limit.py): a route
    that declares it is refused with 429 RATE_LIMITED before its body is checked, its tokens
    counted or its quotas read. Authentication comes first, so an anonymous flood costs no
    statement."""
    s = state.settings
    await take_request(
        state.sessionmaker,
        principal.user_id,
        per_minute=s.api_rate_limit_per_minute,
        burst=s.api_rate_limit_burst,
    )
    return principal


RateLimitedUser = Annotated[Principal, Depends(rate_limited_user)]
