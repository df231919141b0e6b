"""The limit waker: a supervised loop in every worker process that runs EXECUTE (the job
queues), so jobs waiting for a provider's concurrency limit are woken instead of polling.

It LISTENs on `aijobs_limit_freed` (db/limit_waiters.py `CHANNEL`), which the transaction that
ends a call under a key's limits notifies with the key (provider, model, `platform` or
`key:<credential id>`: never a secret). For each key heard it claims the fair heads that now fit
(jobs/limit_wake.py `wake`: one transaction under the key's row lock, so two processes never
signal the same waiter) and signals their workflows (`limit-wake`), which then ask EXECUTE
again. Notifications that arrive together are handled once per key.

The same connection hears the pause waker's channel (`aijobs_pauses`, runtime/pause_waker.py),
handed to it as `also`: the process LISTENs once.

Nothing is polled per job: an idle waker costs one round trip on its LISTEN connection and one
sweep of ended or expired waiters every `idle_s`. On (re)connecting it wakes every key with
waiters (notifications sent while it was away are lost). What a lost wake-up costs is bounded
by the workflow's backstop (engine/limit_wait.py): a lease whose worker was killed expires
and sends no NOTIFY.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

import psycopg
from temporalio.client import Client

from db.errors import is_driver_error
from db.limit_waiters import CHANNEL, parse_payload
from db.provider_limits import LimitKey, LimitTable, parse_model_limits
from db.session import SessionMaker, listen_connection, ping_connection
from engine.capacity import parse_capacity_reserve
from engine.definition import QUEUE_NAMES
from engine.flow import PAUSE_CHANNEL
from engine.limit_wait import LIMIT_WAKE_SIGNAL
from jobs import limit_wake
from runtime.pause_waker import PauseWaker
from runtime.reuse_waker import beside
from runtime.signals import signal_all
from runtime.supervisor import supervise
from runtime.wiring import Parts

log = logging.getLogger(__name__)

# How long the loop waits for a notification before it checks `stop` (no database traffic).
STOP_CHECK_S = 1.0
# Notifications arriving within this long of the first are handled in one pass.
BATCH_S = 0.02


class LimitWaker:
    """One per worker process; `run` is its supervised loop (runtime/supervisor.py)."""

    def __init__(
        self,
        client: Client,
        sessionmaker: SessionMaker,
        database_url: str,
        limits: LimitTable,
        *,
        idle_s: float = 60.0,
        also: Mapping[str, Callable[[str | None], None]] | None = None,
    ) -> None:
        self._client = client
        self._sm = sessionmaker
        self._url = database_url  # a session of its own (DATABASE_DIRECT_URL behind a pooler)
        self._limits = limits
        self._idle_s = idle_s
        # Other channels heard on this connection, each with its handler (the pause waker's):
        # the process LISTENs once. A handler is told None after each (re)connect.
        self._also = dict(also or {})
        self.signalled = 0  # wake-up signals sent (tests, logs)

    async def run(self, stop: asyncio.Event) -> None:
        conn = await listen_connection(self._url, CHANNEL)
        async with conn:
            for channel, handler in self._also.items():
                await conn.execute(f"LISTEN {channel}")  # our constant channel names
                handler(None)
            await self._signal(await limit_wake.wake_all(self._sm, self._limits))
            idle_since = time.monotonic()
            while not stop.is_set():
                keys = await self._heard(conn)
                if keys:
                    for key in keys:
                        await self._wake(key)
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= self._idle_s:
                    await ping_connection(conn)  # a dead connection says so here
                    await limit_wake.sweep(self._sm)
                    idle_since = time.monotonic()

    async def _heard(self, conn: psycopg.AsyncConnection[object]) -> set[tuple[str, str, str]]:
        """The keys notified within STOP_CHECK_S (and those right behind the first)."""
        keys: set[tuple[str, str, str]] = set()
        async for note in conn.notifies(timeout=STOP_CHECK_S, stop_after=1):
            self._add(keys, note.channel, note.payload)
        if keys:
            async for note in conn.notifies(timeout=BATCH_S):
                self._add(keys, note.channel, note.payload)
        return keys

    def _add(self, keys: set[tuple[str, str, str]], channel: str, payload: str) -> None:
        handler = self._also.get(channel)
        if handler is not None:
            handler(payload)
            return
        key = parse_payload(payload)
        if key is not None:
            keys.add(key)

    async def _wake(self, key: tuple[str, str, str]) -> None:
        provider, model, key_ref = key
        limits = self._limits.for_model(provider, model)
        try:
            ids = await limit_wake.wake(self._sm, LimitKey(provider, model, key_ref), limits)
        except Exception as exc:  # a database blip: the backstop covers this wake-up
            if not (is_driver_error(exc) or isinstance(exc, OSError)):
                raise
            log.warning("limit waker could not claim waiters: %s", type(exc).__name__)
            return
        await self._signal(ids)

    async def _signal(self, workflow_ids: Iterable[str]) -> None:
        self.signalled += await signal_all(self._client, workflow_ids, LIMIT_WAKE_SIGNAL)


def limit_waker_task(
    client: Client, parts: Parts, queues: Sequence[str], stop: asyncio.Event
) -> asyncio.Task[int] | None:
    """The waker of a worker process that runs a job queue (EXECUTE), supervised until `stop`;
    None for a process without one."""
    if not set(queues) & set(QUEUE_NAMES):
        return None
    s = parts.settings
    table = parse_model_limits(s.ai_model_limits, parse_capacity_reserve(s.ai_capacity_reserve))
    pause_waker = PauseWaker(client, parts.sessionmaker, s.ai_resume_rate)
    waker = LimitWaker(
        client,
        parts.sessionmaker,
        s.session_database_url,
        table,
        also={PAUSE_CHANNEL: pause_waker.notified},  # its wake-ups on the same connection
    )
    loop = supervise("limit-waker", waker.run, stop)  # with the reuse and pause wakers beside
    both = beside(loop, client, parts.sessionmaker, s.session_database_url, stop)
    pausing = supervise("pause-waker", pause_waker.run, stop)
    return asyncio.create_task(_summed(both, pausing), name="limit-waker")


async def _summed(*loops: Awaitable[int]) -> int:
    """Supervised loops run together as one task; their restarts summed."""
    return sum(await asyncio.gather(*loops))
