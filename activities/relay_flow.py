"""The relay and flow control's times (db/relay.py `NEXT_DUE`): a debounced job's enqueue row is
not due before its time, and a job the relay has not dispatched ends at its start-by time or
deadline (jobs/flow.py `expire_undispatched`). Each claim reads the next of both times, the
relay sleeps no longer than until the sooner, and expires the jobs whose time came: one timer
per relay, none per job, and none at all while no job waits for one (the sleep itself:
activities/relay_wake.py)."""

from __future__ import annotations

import logging

from activities.metrics import WorkerMetrics
from db.relay import Claimed
from db.session import SessionMaker
from jobs import flow

log = logging.getLogger(__name__)


def wake_in_s(claim: Claimed) -> float | None:
    """Seconds to the sooner of the claim's next due time and next expiry (None: neither)."""
    times = [t for t in (claim.due_in_s, claim.expire_in_s) if t is not None]
    return min(times) if times else None


def expiring(claim: Claimed) -> bool:
    """Whether a job the relay has not dispatched has reached its start-by time or deadline."""
    return claim.expire_in_s is not None and claim.expire_in_s <= 0


async def expire_due(sm: SessionMaker, metrics: WorkerMetrics, limit: int) -> int:
    """End up to `limit` undispatched jobs whose time came (one transaction), and count them;
    how many ended. A failure is left to the next claim (the time is read again)."""
    try:
        ended = await flow.expire_undispatched(sm, limit)
    except Exception as exc:
        log.warning("relay could not expire jobs: %s", type(exc).__name__)
        return 0
    for job_type, code in ended:
        metrics.flow.ended(job_type, code)
    if ended:
        log.info("expired %d jobs before their dispatch", len(ended))
    return len(ended)
