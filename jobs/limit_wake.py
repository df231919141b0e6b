"""Waiting for a provider limit without polling: the use cases of the key's fair queue
(db/limit_waiters.py) on both sides of a wait.

- `enqueue`: a call admission held back for a limit (jobs/admission.py `Wait` with a `key`)
  takes its place in the queue, in a transaction of its own after the admission's rolled back
  (nothing else of that look is kept). The same transaction reads the key's room again under
  its row lock (taken first, as admission and the waker do): a call that ended between the
  admission and this commit
  sent its NOTIFY before the waker could see this waiter, so the caller looks again at once
  instead of waiting for the backstop.
- `wake`: a waker (runtime/limit_waker.py) heard that a call of a key ended: the fair heads
  that now fit are claimed (once across every waker process) and their workflow ids returned
  for it to signal.

How long a workflow waits: the exact refill for rpm/tpm, the provider's reset for
`announced`, and for `concurrency` until its wake-up signal or the backstop
(workflows/limit_wait.py). The row outlives that wait by WAITER_GRACE_S: a waiter whose
workflow stopped looking then stops counting.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from db import limit_classes
from db import limit_waiters as waiters_db
from db import provider_limits as provider_limits_db
from db.limit_waiters import WaiterId
from db.provider_limits import LimitKey, Limits, LimitTable
from db.session import SessionMaker
from jobs.waits import Wait

log = logging.getLogger(__name__)

# How long a concurrency wait lasts at most without a wake-up (the workflow's backstop): it
# covers a lease whose worker was killed (it expires and sends no NOTIFY).
BACKSTOP_S = 60.0
# Admission's looks in one EXECUTE attempt: a wait whose room appeared before it entered the
# queue is looked at again at once, this many times at most.
LOOKS_PER_ATTEMPT = 3
# How long a waiter row counts after the wait it was given, if its job never looks again.
WAITER_GRACE_S = 90.0


@dataclass(frozen=True)
class Queued:
    """`entered`: the call just entered the queue (a new wait: counted once). `look_again`:
    room appeared before the waker could see it; the caller asks admission again now."""

    entered: bool
    look_again: bool = False


def waiter_ttl_s(wait: Wait) -> float:
    """How long the waiter row counts: the longest the workflow may wait, plus a grace."""
    longest = BACKSTOP_S if wait.reason == "concurrency" else max(wait.wait_s, 0.0)
    return min(longest, BACKSTOP_S * 10) + WAITER_GRACE_S


async def enqueue(
    sm: SessionMaker,
    wait: Wait,
    job_id: uuid.UUID,
    workflow_id: str | None,
    counted: Callable[[str, str, str, float], None],
) -> Queued:
    """`wait`'s call takes (or keeps) its place in its key's queue (see the module's text) and
    `counted(provider, model, reason, wait_s)` once when it enters. A gate's wait (pause,
    breaker) has no queue and is counted at each look. A queue that cannot be written (the
    database is away) costs the call only its place: it waits as told, and looks again."""
    key, limits = wait.key, wait.limits
    if key is None or limits is None:
        counted(wait.provider, wait.model, wait.reason, wait.wait_s)
        return Queued(entered=True)
    try:
        queued = await _enqueue(
            sm,
            wait,
            key,
            limits,
            WaiterId(job_id, wait.chunk_no, wait.user_id, wait.job_class),
            workflow_id or "",
        )
    except Exception as exc:  # the wait goes on without its place; the next look tries again
        log.warning("could not write a provider limit's waiter: %s", type(exc).__name__)
        return Queued(entered=False)
    if queued.entered:
        counted(wait.provider, wait.model, wait.reason, wait.wait_s)
    return queued


async def _enqueue(
    sm: SessionMaker, wait: Wait, key: LimitKey, limits: Limits, who: WaiterId, workflow_id: str
) -> Queued:
    params = key.params()
    async with sm.begin() as s:
        # The key's row lock first, as admission and the waker take it (never a deadlock).
        room = await provider_limits_db.room(s, key, limits)
        entered = await waiters_db.enqueue(
            s, params, who, workflow_id=workflow_id, tokens=wait.tokens, ttl_s=waiter_ttl_s(wait)
        )
        if room is None:
            return Queued(entered, look_again=True)
        got, _ = await limit_classes.look(s, params, who, room, wait.tokens, limits.reserve)
    return Queued(entered, look_again=got.reason is None)


async def wake(sm: SessionMaker, key: LimitKey, limits: Limits) -> list[str]:
    """The workflow ids of the key's fair heads that fit now, claimed in one transaction under
    the key's row lock (so concurrent wakers claim disjoint waiters). Ended and expired waiters
    are swept on the way."""
    async with sm.begin() as s:
        room = await provider_limits_db.room(s, key, limits)
        params = key.params()
        await waiters_db.sweep_key(s, params)
        # A class with a reserved part waits ahead of the others (db/limit_classes.py).
        reserved = [c for c, _ in limits.reserve]
        queue = await waiters_db.heads(s, params, reserved=reserved)
        if not queue:
            return []
        if room is None:  # nothing limits the key any more: every waiter may go
            return await waiters_db.claim(s, queue)
        return await waiters_db.claim(s, limit_classes.fitting(room, queue, limits.reserve))


async def wake_all(sm: SessionMaker, table: LimitTable) -> list[str]:
    """`wake` for every key with waiters (after the waker (re)connected: notifications sent
    while it was away are lost), then the ended and expired waiters of every key swept."""
    async with sm.begin() as s:
        await waiters_db.sweep(s)
        keys = await waiters_db.keys_waiting(s)
    out: list[str] = []
    for provider, model, key_ref in keys:
        out += await wake(sm, LimitKey(provider, model, key_ref), table.for_model(provider, model))
    return out


async def sweep(sm: SessionMaker) -> int:
    """Drop ended and expired waiters of every key; how many went."""
    async with sm.begin() as s:
        return await waiters_db.sweep(s)
