"""Supervised loops: the webhook deliverer runs as a plain asyncio loop in every `ai-system`
worker process under `supervise` (it must deliver while Temporal is down), and `aijobs relay`
runs the outbox relay's loop the same way. In the `ai-system` workers the relay is a Temporal
activity instead, and its retry policy plays this module's part (activities/relay_activity.py).

A poller handles its own transient failures (a database blip backs off inside its loop); what
escapes it is a bug or something it did not expect. The supervisor then logs the failure (its
type and traceback, never its message: a driver's message repeats statement parameters), counts
it in `aijobs_poller_restarts_total{poller}`, waits a backoff that doubles up to a cap, and starts
the loop again, until the process is asked to stop. A loop that ran healthily for a while before
it failed starts again from the shortest backoff. A poller that returns before the stop is
treated like one that failed: a poller that quietly ends would leave its rows unserved.

Why a restart here is safe: every poller claims its rows in the database (SKIP LOCKED, leases),
so a restarted loop, or several processes running the same loop, never share a row, and a row
a crashed loop left claimed comes back when its lease or lock TTL runs out (docs/architecture.md,
"Pollers").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from activities.failures import loggable
from activities.metrics import WorkerMetrics, worker_metrics

log = logging.getLogger(__name__)

Loop = Callable[[asyncio.Event], Awaitable[None]]


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 0.5
    max_s: float = 30.0
    # A loop that ran this long before it failed was healthy: its next wait is `initial_s`.
    healthy_after_s: float = 60.0


async def supervise(
    name: str,
    loop: Loop,
    stop: asyncio.Event,
    *,
    backoff: Backoff = Backoff(),
    metrics: WorkerMetrics | None = None,
) -> int:
    """Run `loop(stop)` until `stop` is set, starting it again whenever it raises or returns
    early. Returns how many times it was restarted. Cancelling the supervisor cancels the loop."""
    m = metrics or worker_metrics()
    m.poller_restarts_prepared(name)
    restarts = 0
    delay = backoff.initial_s
    while not stop.is_set():
        started = time.monotonic()
        try:
            await loop(stop)
        except Exception as exc:
            failure: BaseException | None = exc
        else:
            if stop.is_set():
                break
            failure = None
        if time.monotonic() - started >= backoff.healthy_after_s:
            delay = backoff.initial_s
        restarts += 1
        m.poller_restarted(name)
        if failure is not None:
            log.error(
                "poller %s failed; restarting it in %.1f s",
                name,
                delay,
                exc_info=loggable(failure),
                extra={"poller": name, "restarts": restarts},
            )
        else:
            log.error(
                "poller %s returned before the stop; restarting it in %.1f s",
                name,
                delay,
                extra={"poller": name, "restarts": restarts},
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(backoff.max_s, delay * 2)
    return restarts


async def until(stop: asyncio.Event, heard: asyncio.Event, timeout_s: float) -> None:
    """Until `stop` or `heard` is set, at most `timeout_s`."""
    if heard.is_set() or timeout_s <= 0:
        return
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(heard.wait())]
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
