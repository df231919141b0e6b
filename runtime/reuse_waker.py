"""The reuse waker: a supervised loop beside the limit waker (every worker process that runs a
job queue), so a job waiting for the job whose answer it reuses is woken when that job ends,
instead of polling.

It follows `ai_reuse_source_ended` through the process's listener (db/listener.py): the
`ai_job_reuse_source_ended` trigger (migration 0028) notifies it in the transaction that ends a
job with a reuse key while a queued job reuses it, whatever ended it (PROJECT, a finalizer, the
cancel API, the reconciler); the payload is the source's id. For each source heard it reads the
queued jobs that reuse it (`jobs/reuse.py` `dependents`) and signals their workflows
`reuse-source-ended` (runtime/signals.py); each runs its `reuse` stage again (copy the answer, or
make its own call).

Every waker process hears every NOTIFY, so with several processes a dependent gets one signal
from each: harmless (the stage is idempotent; a signal after the wait ended is ignored), and
cheaper than a claim per signal. When the listener (re)connects it signals every queued job
whose source has already ended (a NOTIFY sent while nobody listened is lost); what a lost signal
costs beyond that is bounded by the workflow's backstop (engine/tiers.py
`REUSE_WAIT_BACKSTOP_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Iterable

from temporalio.client import Client

from db.errors import is_driver_error
from db.listener import Listener
from db.session import SessionMaker
from engine.tiers import REUSE_SOURCE_ENDED_SIGNAL
from jobs import reuse
from runtime.signals import signal_all
from runtime.supervisor import supervise

log = logging.getLogger(__name__)

# The trigger's channel (migration 0028).
CHANNEL = "ai_reuse_source_ended"
# Notifications arriving within this long of the first are handled in one pass.
BATCH_S = 0.02


class ReuseWaker:
    """One per worker process; `run` is its supervised loop (runtime/supervisor.py), fed by
    `notified`, the listener's handler of `ai_reuse_source_ended`."""

    def __init__(self, client: Client, sessionmaker: SessionMaker) -> None:
        self._client = client
        self._sm = sessionmaker
        self._sources: set[uuid.UUID] = set()
        self._stranded = False  # every queued job whose source ended (after a (re)connect)
        self._heard = asyncio.Event()
        self.signalled = 0  # signals sent (tests, logs)

    def notified(self, payload: str | None) -> None:
        """A source ended (its id), or MISSED: every job whose source has ended."""
        if payload is None:
            self._stranded = True
        else:
            with contextlib.suppress(ValueError):
                self._sources.add(uuid.UUID(payload))
        self._heard.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._heard.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if stop.is_set():
                return
            await asyncio.sleep(BATCH_S)  # the sources right behind the first, together
            self._heard.clear()
            sources, self._sources = self._sources, set()
            stranded, self._stranded = self._stranded, False
            if stranded:
                await self._signal(await reuse.stranded(self._sm))
            for source in sources:
                await self._wake(source)

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


async def beside(
    limit_loop: Awaitable[int],
    client: Client,
    sm: SessionMaker,
    listener: Listener,
    stop: asyncio.Event,
) -> int:
    """The limit waker's supervised loop and the reuse waker's (on the same `listener`), run
    together as one task (the processes that run a job queue need both, and stop them alike);
    their restarts summed."""
    waker = ReuseWaker(client, sm)
    listener.on(CHANNEL, waker.notified)
    counts = await asyncio.gather(limit_loop, supervise("reuse-waker", waker.run, stop))
    return sum(counts)
