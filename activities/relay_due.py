"""The relay and due times (db/relay.py "by-design waits"): a row that is not due yet, a delayed
job's enqueue say, is claimed at its time, so the relay sleeps no longer than until the next due
time its last claim read, and a delayed job's workflow starts then without a timer of its own."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from db.outbox import OutboxRow

# A delayed job is dispatched at its runAt (its row's due time), so its workflow starts at once.
# Only a row dispatched early (written by an earlier version; an operator's requeue) still
# carries a runAt ahead, which its workflow then waits for on a timer.
RUN_AT_SLACK_S = 1.0


def sleep_s(poll_interval_s: float, next_due: float | None, floor_s: float) -> float:
    """How long the relay may sleep: the poll interval, or less, until `next_due` (monotonic
    time; None: nothing due later), at least `floor_s` (a due job whose row another claim
    holds is not claimed in a tight loop)."""
    if next_due is None:
        return poll_interval_s
    return min(poll_interval_s, max(next_due - time.monotonic(), floor_s))


def still_ahead(run_at: object) -> str:
    """An enqueue payload's runAt (RFC 3339) when it is still more than RUN_AT_SLACK_S ahead,
    else "": the workflow waits only for a time still to come."""
    try:
        at = datetime.fromisoformat(str(run_at)) if run_at else None
    except ValueError:
        return ""
    if at is None or at.tzinfo is None:
        return ""
    return at.isoformat() if (at - datetime.now(UTC)).total_seconds() > RUN_AT_SLACK_S else ""


def lag_s(row: OutboxRow) -> float:
    """How long the row waited to be dispatched once it was due: since its creation, or since
    its available time when that came later (a delayed job's start; a first claim only: a
    retry's backoff counts as lag)."""
    due = max(row.created_at, row.available_at) if row.attempt_count <= 1 else row.created_at
    return (datetime.now(UTC) - due).total_seconds()
