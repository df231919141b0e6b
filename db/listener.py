"""The process's one LISTEN connection: a `{channel: handlers}` table over one autocommit psycopg
connection, reconnected with a backoff.

Every part of a process that wakes on a NOTIFY (the relay, the webhook deliverer, the limit and
reuse wakers, the API's event streams) registers a handler here instead of opening a connection
of its own. Why one: PostgreSQL (up to 18) signals every listening backend of a database on
every NOTIFY committed in it, whatever the channel, and each backend reads the queue in a
transaction of its own, so each LISTEN connection costs a transaction per notifying commit of
the whole engine; and one named connection per process is what an operator reads in
`pg_stat_activity` (`<process>-listener`).

A handler is a plain function: `handler(payload)` for each notification on its channel, and
`handler(None)` ("you may have missed notifications: read the state again") once its channel is
listened on, after every (re)connect: a NOTIFY sent while nobody listened is lost. Handlers run
on the listener's task, between two reads of the connection, so they only record what they
heard (a set, an event) and return: the work is done by their owner's loop.

The connection goes to a session of its own (DATABASE_DIRECT_URL behind a transaction pooler:
through the pooler a LISTEN would be lost), named `<process>-listener` (`application_name`, a
connection parameter), with TCP keepalives, so that a dead peer is noticed by the kernel rather
than by a statement; a rare `SELECT 1` is the backstop. It is the only connection of a process
that issues LISTEN (channels are code constants, never input).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import psycopg
from psycopg.conninfo import make_conninfo

from db.session import DEFAULT_APPLICATION_NAME, libpq_url

log = logging.getLogger(__name__)

# A handler: a notification's payload, or None after a (re)connect (re-read the state).
Handler = Callable[[str | None], None]
MISSED: None = None

# How long one read of the connection waits before the loop looks at new registrations and
# the stop (no database traffic: a wait on the socket).
TICK_S = 0.25
# A `SELECT 1` after this long without one: the keepalives' backstop (one transaction).
PING_EVERY_S = 300.0
# Reconnect backoff: doubling from the first to the last.
BACKOFF_S = (0.2, 5.0)
# libpq keepalives: a silent peer is given up after about 30 + 3 x 10 s.
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


class Listener:
    """One per process. `on(channel, handler)` registers (at any time); `start()` runs the
    connection's task until `close()`. `connects` counts the connections made (tests)."""

    def __init__(
        self,
        database_url: str,
        *,
        application_name: str = DEFAULT_APPLICATION_NAME,
        tick_s: float = TICK_S,
        ping_every_s: float = PING_EVERY_S,
    ) -> None:
        self._url = database_url
        self.application_name = f"{application_name}-listener"
        self._tick_s = tick_s
        self._ping_every_s = ping_every_s
        self._handlers: dict[str, list[Handler]] = {}
        self._fresh: list[Handler] = []  # registered since the last look: told MISSED once
        self._listened: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[object] | None = None
        self._up = asyncio.Event()  # connected, every registered channel listened on
        self.connects = 0

    # ---- the table ------------------------------------------------------------------------

    def on(self, channel: str, handler: Handler) -> Callable[[], None]:
        """Register `handler` for `channel` (an identifier constant of ours); returns what
        unregisters it. The handler is told MISSED once its channel is listened on."""
        if not channel.isidentifier():
            raise ValueError(f"not a channel name: {channel!r}")
        self._handlers.setdefault(channel, []).append(handler)
        self._fresh.append(handler)
        if channel not in self._listened:
            self._up.clear()  # `listening()` waits for this channel's LISTEN

        def off() -> None:
            handlers = self._handlers.get(channel, [])
            if handler in handlers:
                handlers.remove(handler)
            if handler in self._fresh:
                self._fresh.remove(handler)

        return off

    @property
    def channels(self) -> frozenset[str]:
        return frozenset(c for c, hs in self._handlers.items() if hs)

    async def listening(self, timeout_s: float = 5.0) -> bool:
        """Until the connection is up and every channel registered so far is listened on;
        False after `timeout_s`."""
        self.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._up.wait(), timeout_s)
        return self._up.is_set()

    # ---- the connection ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the connection's task (idempotent; again after it ended)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=self.application_name)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        self._up.clear()

    async def drop_connection_for_tests(self) -> None:
        """Closes the connection as a network failure would (the listener reconnects)."""
        if self._conn is not None:
            await self._conn.close()

    async def _run(self) -> None:
        backoff = BACKOFF_S[0]
        while True:
            try:
                conn = await self._connect()
                try:
                    self._conn = conn
                    self.connects += 1
                    self._listened = set()
                    # Every handler hears MISSED after this (re)connect.
                    self._fresh = [h for hs in self._handlers.values() for h in hs]
                    backoff = BACKOFF_S[0]
                    await self._serve(conn)
                finally:
                    # Closed whatever ends the loop, a cancel included (an autocommit connection
                    # has nothing to commit or roll back first, and a rollback awaited on a
                    # cancelled task could be cut short, leaving the connection open).
                    await conn.close()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "LISTEN connection lost; reconnecting", extra={"error": type(exc).__name__}
                )
            finally:
                self._conn = None
                self._up.clear()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_S[1])

    async def _connect(self) -> psycopg.AsyncConnection[object]:
        conninfo = make_conninfo(
            libpq_url(self._url), application_name=self.application_name, **KEEPALIVES
        )
        conn: psycopg.AsyncConnection[object] = await psycopg.AsyncConnection.connect(
            conninfo, autocommit=True
        )
        return conn

    async def _serve(self, conn: psycopg.AsyncConnection[object]) -> None:
        last_io = time.monotonic()
        while True:
            if await self._listen_new(conn):
                last_io = time.monotonic()
            self._tell_fresh()
            heard = False
            async for note in conn.notifies(timeout=self._tick_s):
                heard = True
                self._dispatch(note.channel, note.payload)
            now = time.monotonic()
            if heard:
                last_io = now
            elif now - last_io >= self._ping_every_s:
                await conn.execute("SELECT 1")  # a dead connection says so here
                last_io = now

    async def _listen_new(self, conn: psycopg.AsyncConnection[object]) -> bool:
        """LISTEN on the channels registered since the last look, in one round trip (a
        notification arriving meanwhile waits in psycopg's backlog)."""
        new = sorted(self.channels - self._listened)
        if new:
            await conn.execute("; ".join(f"LISTEN {c}" for c in new))
            self._listened.update(new)
        self._up.set()
        return bool(new)

    def _tell_fresh(self) -> None:
        fresh, self._fresh = self._fresh, []
        for handler in fresh:
            self._call(handler, MISSED)

    def _dispatch(self, channel: str, payload: str) -> None:
        for handler in list(self._handlers.get(channel, ())):
            self._call(handler, payload)

    @staticmethod
    def _call(handler: Handler, payload: str | None) -> None:
        try:
            handler(payload)
        except Exception as exc:  # one handler's bug must not stop the others' wake-ups
            log.error("LISTEN handler failed", extra={"error": type(exc).__name__})
