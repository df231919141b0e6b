"""The limit waker: a supervised loop in every worker process that runs EXECUTE (the job
queues), so jobs waiting for a provider's concurrency limit are woken instead of polling.

It follows `aijobs_limit_freed` (db/limit_waiters.py `CHANNEL`) through the process's listener
(db/listener.py): the transaction that ends a call under a key's limits notifies it with the key
(provider, model, `platform` or `key:<credential id>`: never a secret). For each key heard it
claims the fair heads that now fit (jobs/limit_wake.py `wake`: one transaction under the key's
row lock, so two processes never signal the same waiter) and signals their workflows
(`limit-wake`, runtime/signals.py), which then ask EXECUTE again. Notifications that arrive
together are handled once per key.

Beside it, on the same listener, the pause waker (runtime/pause_waker.py) hears `aijobs_pauses`.

Nothing is polled per job: an idle waker costs nothing but a sweep of ended or expired waiters
every `sweep_every_s`. When the listener (re)connects it wakes every key with waiters
(notifications sent while nobody listened are lost). What a lost wake-up costs is bounded by the
workflow's backstop (engine/limit_wait.py): a lease whose worker was killed expires and sends no
NOTIFY.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable, Sequence

from temporalio.client import Client

from db.errors import is_driver_error
from db.limit_waiters import CHANNEL, parse_payload
from db.listener import Listener
from db.provider_limits import LimitKey, LimitTable, parse_model_limits
from db.session import SessionMaker
from engine.capacity import parse_capacity_reserve
from engine.definition import QUEUE_NAMES
from engine.flow import PAUSE_CHANNEL
from engine.limit_wait import LIMIT_WAKE_SIGNAL
from jobs import limit_wake
from runtime.pause_waker import PauseWaker
from runtime.reuse_waker import beside
from runtime.signals import signal_all
from runtime.supervisor import supervise, until
from runtime.wiring import Parts

log = logging.getLogger(__name__)

# Notifications arriving within this long of the first are handled in one pass.
BATCH_S = 0.02
# Ended and expired waiters are swept this often when nothing else touched their keys (each
# key's wake sweeps its own on the way).
SWEEP_EVERY_S = 600.0


class LimitWaker:
    """One per worker process; `run` is its supervised loop (runtime/supervisor.py), fed by
    `notified`, the listener's handler of `aijobs_limit_freed`."""

    def __init__(
        self,
        client: Client,
        sessionmaker: SessionMaker,
        limits: LimitTable,
        *,
        sweep_every_s: float = SWEEP_EVERY_S,
    ) -> None:
        self._client = client
        self._sm = sessionmaker
        self._limits = limits
        self._sweep_every_s = sweep_every_s
        self._keys: set[tuple[str, str, str]] = set()
        self._all = False  # every key with waiters (after a (re)connect)
        self._heard = asyncio.Event()
        self.signalled = 0  # wake-up signals sent (tests, logs)

    def notified(self, payload: str | None) -> None:
        """A key's call ended (its payload), or MISSED: every key with waiters."""
        if payload is None:
            self._all = True
        else:
            key = parse_payload(payload)
            if key is None:
                return
            self._keys.add(key)
        self._heard.set()

    async def run(self, stop: asyncio.Event) -> None:
        last_sweep = time.monotonic()
        while not stop.is_set():
            await until(stop, self._heard, self._sweep_every_s - (time.monotonic() - last_sweep))
            if stop.is_set():
                return
            if self._heard.is_set():
                await asyncio.sleep(BATCH_S)  # the keys right behind the first, together
                self._heard.clear()
                keys, self._keys = self._keys, set()
                every, self._all = self._all, False
                if every:
                    await self._signal(await limit_wake.wake_all(self._sm, self._limits))
                    last_sweep = time.monotonic()
                for key in keys:
                    await self._wake(key)
            elif time.monotonic() - last_sweep >= self._sweep_every_s:
                await limit_wake.sweep(self._sm)
                last_sweep = time.monotonic()

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
    client: Client,
    parts: Parts,
    queues: Sequence[str],
    stop: asyncio.Event,
    listener: Listener,
) -> asyncio.Task[int] | None:
    """The wakers of a worker process that runs a job queue (EXECUTE), on the process's
    `listener`, supervised until `stop`; None for a process without one."""
    if not set(queues) & set(QUEUE_NAMES):
        return None
    s = parts.settings
    table = parse_model_limits(s.ai_model_limits, parse_capacity_reserve(s.ai_capacity_reserve))
    waker = LimitWaker(client, parts.sessionmaker, table)
    listener.on(CHANNEL, waker.notified)
    pause_waker = PauseWaker(client, parts.sessionmaker, s.ai_resume_rate)
    listener.on(PAUSE_CHANNEL, pause_waker.notified)
    loop = supervise("limit-waker", waker.run, stop)  # with the reuse and pause wakers beside
    both = beside(loop, client, parts.sessionmaker, listener, stop)
    pausing = supervise("pause-waker", pause_waker.run, stop)
    return asyncio.create_task(_summed(both, pausing), name="limit-waker")


async def _summed(*loops: Awaitable[int]) -> int:
    """Supervised loops run together as one task; their restarts summed."""
    return sum(await asyncio.gather(*loops))
