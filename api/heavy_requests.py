"""Large request bodies take turns, so one caller's burst of them cannot take the event loop
or the database pool from everyone else.

A create or quote of a long source costs the event loop milliseconds before any check runs (its
JSON parsed, the body model validated) and again when it is written (its input serialized twice,
for the job and its snapshot), and its checks a thread of the bounded check pool
(jobs/token_count.py). Thirty-two of them arriving at once would queue all that work on the loop
in front of other callers' reads. This pure ASGI middleware admits a request whose body is large
(HEAVY_BODY_BYTES or more, or of unknown length) before the app reads a byte of it only when
(1) no other large request of the same caller (the same `Authorization` header) is in the app,
and (2) fewer than `slots` large requests are: the check pool's threads plus one, so one request
can do its loop work while the others count. Waiters are admitted in arrival order within a
caller, and callers do not wait behind each other's queues (each caller's first waiter holds its
place). A request that waits longer than `wait_s` (the check pool's wait) is answered 429
`RATE_LIMITED` with `Retry-After: 1`, as the check pool answers, never a 5xx, and its body is
read and discarded (bounded) so that the client gets the answer rather than a reset.

Small bodies and every other request go straight through: a read never waits here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import problem
from api.limits import declared_length
from engine.errors import RateLimited

# A body this large takes the loop milliseconds to parse and validate.
HEAVY_BODY_BYTES = 64 * 1024
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# A refused request's body is discarded for at most this long (it may still be arriving).
DRAIN_SECONDS = 5.0
BUSY_RETRY_AFTER_S = 1


def is_heavy(scope: Scope) -> bool:
    """A request with a body of HEAVY_BODY_BYTES or more, or of a length it does not say."""
    if scope["type"] != "http" or scope.get("method") not in BODY_METHODS:
        return False
    length = declared_length(scope)
    if length is None:  # chunked, or no Content-Length: only a body-less request is light
        return any(name.lower() == b"transfer-encoding" for name, _ in scope["headers"])
    return length >= HEAVY_BODY_BYTES


def caller_of(scope: Scope) -> bytes:
    """Whose request: its Authorization header (kept in memory only), else its peer address."""
    for name, value in scope["headers"]:
        if name.lower() == b"authorization":
            return bytes(value)
    client = scope.get("client")
    return repr(client).encode()


class HeavyRequestGate:
    """The middleware (see the module's text)."""

    def __init__(self, app: ASGIApp, *, slots: int, wait_s: float) -> None:
        if slots < 1 or wait_s <= 0:
            raise ValueError("the gate needs at least one slot and a positive wait")
        self.app = app
        self.slots = slots
        self.wait_s = wait_s
        # Bound to the loop that first needs them (a test may run several loops in turn).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._free = asyncio.Semaphore(slots)
        self._lanes: dict[bytes, tuple[asyncio.Lock, int]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_heavy(scope):
            await self.app(scope, receive, send)
            return
        try:
            async with self._turn(caller_of(scope)):
                await self.app(scope, receive, send)
        except _Busy:
            await self._refuse(receive, send)

    @contextlib.asynccontextmanager
    async def _turn(self, caller: bytes) -> AsyncIterator[None]:
        """The caller's lane, then a slot, within `wait_s`; raises _Busy when they do not
        come in time."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._free, self._lanes = loop, asyncio.Semaphore(self.slots), {}
        lock, users = self._lanes.get(caller, (asyncio.Lock(), 0))
        self._lanes[caller] = (lock, users + 1)
        try:
            try:
                async with asyncio.timeout(self.wait_s):
                    await lock.acquire()
                    try:
                        await self._free.acquire()
                    except BaseException:
                        lock.release()
                        raise
            except TimeoutError:
                raise _Busy() from None
            try:
                yield
            finally:
                self._free.release()
                lock.release()
        finally:
            lock, users = self._lanes[caller]
            if users <= 1:
                del self._lanes[caller]
            else:
                self._lanes[caller] = (lock, users - 1)

    async def _refuse(self, receive: Receive, send: Send) -> None:
        """429 RATE_LIMITED with Retry-After, then the body read and dropped (bounded)."""
        exc = RateLimited(
            "This server is busy with other large requests; try again shortly.",
            retry_after_s=BUSY_RETRY_AFTER_S,
        )
        response = problem(
            exc.http_status,
            exc.code,
            exc.title,
            exc.public_message,
            headers={"Retry-After": str(BUSY_RETRY_AFTER_S), "Connection": "close"},
        )
        start = {"type": "http.response.start", "status": response.status_code}
        await send({**start, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body, "more_body": True})
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_SECONDS):
                while True:
                    message = await receive()
                    if message["type"] != "http.request" or not message.get("more_body"):
                        break
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _Busy(Exception):
    """No turn came within the wait."""
