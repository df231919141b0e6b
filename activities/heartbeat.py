"""EXECUTE's transactions against a slow or absent database: heartbeats to Temporal on their own
clock while one runs (`heartbeating`), and a retry through an outage (`db_retry`), so only a dead
worker, never a slow database, times EXECUTE out or spends one of the job's provider attempts."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from temporalio import activity

from activities.deps import log
from db.errors import is_statement_fault, is_unavailable, sqlstate

T = TypeVar("T")

# Tries of one EXECUTE transaction that a statement fault stops (a statement timeout, a lock not
# available: db/errors.py): after the last, the attempt fails (EXECUTE's retry policy bounds
# the attempts), never waited on as an outage.
STATEMENT_FAULT_TRIES = 3


async def db_retry(op: Callable[[], Awaitable[T]], *, budget_s: float, delay_s: float = 0.5) -> T:
    """EXECUTE's own transactions ride out a database outage (heartbeating meanwhile) instead of
    failing the attempt: a lost connection must not spend one of the job's provider attempts.
    A statement fault is tried at most STATEMENT_FAULT_TRIES times in all, then raised."""
    delay = delay_s
    deadline = time.monotonic() + budget_s
    faults = 0
    while True:
        try:
            return await op()
        except Exception as exc:
            if is_statement_fault(exc):
                faults += 1
                if faults >= STATEMENT_FAULT_TRIES:
                    raise
                log.warning(
                    "statement stopped in EXECUTE (SQLSTATE %s); try %d of %d",
                    sqlstate(exc),
                    faults + 1,
                    STATEMENT_FAULT_TRIES,
                )
            elif not is_unavailable(exc) or time.monotonic() > deadline:
                raise
            else:
                log.warning("database unavailable in EXECUTE; retrying in %.1fs", delay)
            activity.heartbeat()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 4.0)


@contextlib.asynccontextmanager
async def heartbeating() -> AsyncIterator[None]:
    """Heartbeat to Temporal on its own clock while the body runs (a transaction that waits on
    a lock or a reconnect), so only a dead worker, never a slow database, times EXECUTE out."""
    interval = beat_interval_s()

    async def beat() -> None:
        while True:
            # After the first interval, not at once: a transaction that commits within it (nearly
            # all do) costs no heartbeat, which Temporal would record in the run's state.
            await asyncio.sleep(interval)
            activity.heartbeat()

    task = asyncio.ensure_future(beat())
    try:
        yield
    finally:
        task.cancel()


def beat_interval_s() -> float:
    """A quarter of this attempt's heartbeat timeout (its job type's or queue's lock), between
    0.2 s and 0.5 s: several beats always land inside the timeout."""
    timeout = activity.info().heartbeat_timeout
    timeout_s = timeout.total_seconds() if timeout else 10.0
    return max(0.2, min(0.5, timeout_s / 4))
