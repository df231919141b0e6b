"""The reuse waker: a supervised loop beside the limit waker (every worker process that runs a
job queue), so a job waiting for the job whose answer it reuses is woken when that job ends,
instead of polling.

It LISTENs on `ai_reuse_source_ended`, which the `ai_job_reuse_source_ended` trigger
(migration 0028) notifies in the transaction that ends a job with a reuse key while a queued
job reuses it, whatever ended it (PROJECT, a finalizer, the cancel API, the reconciler); the
payload is the source's id. For each source heard it reads the queued jobs that reuse it
(`jobs/reuse.py` `dependents`) and signals their workflows `reuse-source-ended`; each runs its
`reuse` stage again (copy the answer, or make its own call).

Every waker process hears every NOTIFY, so with several processes a dependent gets one signal
from each: harmless (the stage is idempotent; a signal after the wait ended is ignored), and
cheaper than a claim per signal. On (re)connecting it signals every queued job whose source has
already ended (a NOTIFY sent while nobody listened is lost); what a lost signal costs beyond
that is bounded by the workflow's backstop (engine/tiers.py `REUSE_WAIT_BACKSTOP_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Iterable

import psycopg
from temporalio.client import Client

from db.errors import is_driver_error
from db.session import SessionMaker, listen_connection, ping_connection
from engine.tiers import REUSE_SOURCE_ENDED_SIGNAL
from jobs import reuse
from runtime.signals import signal_all
from runtime.supervisor import supervise

log = logging.getLogger(__name__)

# The trigger's channel (migration 0028).
CHANNEL = "ai_reuse_source_ended"
# How long the loop waits for a notification before it checks `stop` (no database traffic).
STOP_CHECK_S = 1.0
# Notifications arriving within this long of the first are handled in one pass.
BATCH_S = 0.02


class ReuseWaker:
    """One per worker process; `run` is its supervised loop (runtime/supervisor.py)."""

    def __init__(
        self, client: Client, sessionmaker: SessionMaker, database_url: str, *, idle_s: float = 60.0
    ) -> None:
        self._client = client
        self._sm = sessionmaker
        self._url = database_url  # a session of its own (DATABASE_DIRECT_URL behind a pooler)
        self._idle_s = idle_s
        self.signalled = 0  # signals sent (tests, logs)

    async def run(self, stop: asyncio.Event) -> None:
        conn = await listen_connection(self._url, CHANNEL)
        async with conn:
            await self._signal(await reuse.stranded(self._sm))
            idle_since = time.monotonic()
            while not stop.is_set():
                sources = await self._heard(conn)
                for source in sources:
                    await self._wake(source)
                if sources:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= self._idle_s:
                    await ping_connection(conn)  # a dead connection says so here
                    idle_since = time.monotonic()

    @staticmethod
    async def _heard(conn: psycopg.AsyncConnection[object]) -> set[uuid.UUID]:
        """The sources notified within STOP_CHECK_S (and those right behind the first)."""
        sources: set[uuid.UUID] = set()
        async for note in conn.notifies(timeout=STOP_CHECK_S, stop_after=1):
            _add(sources, note.payload)
        if sources:
            async for note in conn.notifies(timeout=BATCH_S):
                _add(sources, note.payload)
        return sources

    async def _wake(self, source: uuid.UUID) -> None:
        try:
            ids = await reuse.dependents(self._sm, source)
        except Exception as exc:  # a database blip: the backstop covers this wake-up
            if not (is_driver_error(exc) or isinstance(exc, OSError)):
                raise
            log.warning("reuse waker could not read dependents: %s", type(exc).__name__)
            return
        await self._signal(ids)

    async def _signal(self, workflow_ids: Iterable[str]) -> None:
        self.signalled += await signal_all(self._client, workflow_ids, REUSE_SOURCE_ENDED_SIGNAL)


def _add(sources: set[uuid.UUID], payload: str) -> None:
    with contextlib.suppress(ValueError):
        sources.add(uuid.UUID(payload))


async def beside(
    limit_loop: Awaitable[int], client: Client, sm: SessionMaker, url: str, stop: asyncio.Event
) -> int:
    """The limit waker's supervised loop and the reuse waker's, run together as one task (the
    processes that run a job queue need both, and stop them alike); their restarts summed."""
    waker = ReuseWaker(client, sm, url)
    counts = await asyncio.gather(limit_loop, supervise("reuse-waker", waker.run, stop))
    return sum(counts)
