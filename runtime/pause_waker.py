"""The pause waker: a supervised loop in every worker process that runs EXECUTE (beside the limit
waker), so jobs an operator pause held go again once it is lifted, without polling per job.

It is woken through the process's listener by `aijobs_pauses` (engine/flow.py `PAUSE_CHANNEL`),
which the transaction that creates, deletes or expires a pause notifies (no payload), and
`notified(None)` after every (re)connect (a NOTIFY sent while nobody listened is lost). Each
pass, in this order (jobs/pauses.py):

1. pauses past their `expiresAt` are lifted, as a DELETE does, with a `pause.expire` entry
   (actor `system`; each is lifted once, whichever process gets there first);
2. the held jobs no pause in force matches any more are released in fair order (each user's
   first, then each user's second...), at most AI_RESUME_RATE a second across the cluster: a
   pass takes up to a second's worth, each with its slot 1/rate after the previous one (the one
   pace row, locked, holds the next free slot), and wakes each at its slot with the
   `limit-wake` signal (runtime/signals.py); it keeps releasing while some remain;
3. it sleeps until a notification, the next pause's expiry, the pace's next release, or
   IDLE_S (a pass that releases what a lost notification left behind).

Idle, it costs one pass every IDLE_S and nothing per job.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence

from temporalio.client import Client

from db.errors import is_driver_error
from db.session import SessionMaker
from engine.limit_wait import LIMIT_WAKE_SIGNAL
from jobs import pauses
from runtime.signals import signal_all
from runtime.supervisor import until

log = logging.getLogger(__name__)

# A pass at least this often without a notification.
IDLE_S = 600.0
# After a failed pass (the database away), the next one waits this long.
RETRY_S = 5.0


class PauseWaker:
    """One per worker process; `run` is its supervised loop (runtime/supervisor.py), fed by
    `notified`, the listener's handler of `aijobs_pauses`."""

    def __init__(
        self, client: Client, sessionmaker: SessionMaker, rate: float, *, idle_s: float = IDLE_S
    ) -> None:
        self._client = client
        self._sm = sessionmaker
        self._rate = rate
        self._idle_s = idle_s
        self._heard = asyncio.Event()
        self._heard.set()  # a first pass at start: pauses lifted while no waker ran
        self.signalled = 0  # wake-up signals sent (tests, logs)

    def notified(self, payload: str | None) -> None:
        """A pause was created, deleted or expired (or MISSED: read everything again)."""
        self._heard.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._heard.clear()
            try:
                sleep_s = await self.once()
            except Exception as exc:  # a database blip: the held jobs' backstop covers it
                if not (is_driver_error(exc) or isinstance(exc, OSError)):
                    raise
                log.warning("pause waker pass failed: %s", type(exc).__name__)
                sleep_s = RETRY_S
            await until(stop, self._heard, sleep_s)

    async def once(self) -> float:
        """One pass (module text); how long it may sleep before the next."""
        lifted = await pauses.lift_expired(self._sm)
        if lifted:
            log.info("operator pauses expired", extra={"count": len(lifted)})
        released = await pauses.release(self._sm, self._rate)
        await self._signal_at(released.slots)
        nexts = [self._idle_s]
        if released.more:  # its slots have passed while it signalled: the next pass may go
            nexts.append(0.0 if released.slots else released.next_in_s)
        expiry = await pauses.next_expiry_s(self._sm)
        if expiry is not None:
            nexts.append(max(expiry, 0.0))
        return min(nexts)

    async def _signal_at(self, slots: Sequence[tuple[str, float]]) -> None:
        """Each released job's wake-up at its slot (seconds from now): the pace holds for the
        calls, not only for the releases. A job whose signal is lost (this process stops now)
        looks again at its backstop."""
        start = time.monotonic()
        for workflow_id, at in slots:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            await self._signal([workflow_id])

    async def _signal(self, workflow_ids: Iterable[str]) -> None:
        self.signalled += await signal_all(self._client, workflow_ids, LIMIT_WAKE_SIGNAL)
