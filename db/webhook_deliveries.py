"""Webhook deliveries: fan-out, the deliverer's claim and marks, operators' reads and replay
(see docs/webhooks.md; the endpoints are db/webhooks.py's).

A delivery row is written by the relay, in the transaction that marks a job's domain event
(`ai.job.completed|failed|cancelled`) published: one row per matching endpoint of the job's owner
(`fan_out`). The deliverer claims due rows under `FOR UPDATE SKIP LOCKED`, pushing
`next_attempt_at` one lease ahead, so a deliverer that dies mid-request costs a retry after the
lease, never a delivery, and a row is never claimed by two deliverers at once. No transaction is
open while a receiver is called.

Fairness: the claim serves users round-robin (each owner's oldest due row first, then each
one's second ...), never one queue in due order across users, and never more of a user's rows
than that user's free share (the deliverer's per-user slots less what it has in flight on any
deliverer, counted from the rows' live claims; deliverers' claims are serialised by one
advisory lock, `claim_share`): one user's backlog cannot queue another user's delivery behind
it, whatever the number of deliverers. Finished rows (delivered, dead) are purged after their
retention.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.outbox import UUID_RE
from db.webhooks import WEBHOOK_EVENTS

# The API validates against this Literal; the tuple is the same values for SQL.
DeliveryStatus = Literal["pending", "delivered", "failed", "dead"]
DELIVERY_STATUSES: tuple[str, ...] = get_args(DeliveryStatus)
REPLAYABLE = ("delivered", "failed", "dead")


@dataclass(frozen=True)
class DeliveryRow:
    id: int
    endpoint_id: uuid.UUID
    user_id: str
    event_id: int
    job_id: str
    webhook_id: str
    event_type: str
    occurred_at: datetime
    status: str
    attempt_count: int
    next_attempt_at: datetime
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    replayed_at: datetime | None
    delivered_at: datetime | None
    finished_at: datetime | None


# The statements of this module interpolate only its own constants (this column list); every
# value a caller passes (ids, statuses, limits) is a bind parameter.
_DELIVERY = (
    "id, endpoint_id, user_id, event_id, job_id, webhook_id, event_type, occurred_at, status, "
    "attempt_count, next_attempt_at, last_status_code, last_error, created_at, replayed_at, "
    "delivered_at, finished_at"
)


# ---- fan-out (the relay's publish transaction) ------------------------------------------------


# One delivery per published domain event and matching live endpoint of the job's owner.
# Idempotent (unique endpoint and event): a row published twice fans out once. Each new row
# wakes the deliverers (`NOTIFY ai_webhook` at commit, one per transaction), so they need not
# poll for new work.
FAN_OUT = text(
    """
    INSERT INTO webhook_delivery (endpoint_id, user_id, event_id, job_id, webhook_id,
                                  event_type, occurred_at, status, attempt_count,
                                  next_attempt_at, created_at)
    SELECT e.id, e.user_id, o.id, o.aggregate_id,
           'msg_' || o.id || '_' || replace(e.id::text, '-', ''),
           o.event_type, o.created_at, 'pending', 0, now(), now()
    FROM outbox_event o
    JOIN ai_job j ON j.id = CASE WHEN o.aggregate_id ~* :uuid_re
                                 THEN o.aggregate_id::uuid END
    JOIN webhook_endpoint e ON e.user_id = j.user_id AND e.deleted_at IS NULL
                           AND e.event_types ? o.event_type
    WHERE o.id = ANY(:ids) AND o.status = 'published' AND o.event_type = ANY(:types)
    ON CONFLICT (endpoint_id, event_id) DO NOTHING
    RETURNING pg_notify('ai_webhook', '') IS NULL AS notified
    """
)


# Deliverers LISTEN here: a new pending delivery was committed.
NOTIFY_CHANNEL = "ai_webhook"


def fan_out_params(event_ids: Sequence[int]) -> dict[str, object]:
    return {"ids": list(event_ids), "types": list(WEBHOOK_EVENTS), "uuid_re": UUID_RE}


async def fan_out(session: AsyncSession, event_ids: Sequence[int]) -> int:
    """`FAN_OUT` for these outbox rows; how many deliveries it created."""
    if not event_ids:
        return 0
    result = await session.execute(FAN_OUT, fan_out_params(event_ids))
    return int(result.rowcount)  # type: ignore[attr-defined]


# ---- the deliverer ----------------------------------------------------------------------------


CLAIM_DUE = text(
    f"""
    WITH RECURSIVE owners(user_id) AS (
        (SELECT user_id FROM webhook_delivery
         WHERE status IN ('pending', 'failed') ORDER BY user_id LIMIT 1)
        UNION ALL
        SELECT (SELECT d.user_id FROM webhook_delivery d
                WHERE d.status IN ('pending', 'failed') AND d.user_id > o.user_id
                ORDER BY d.user_id LIMIT 1)
        FROM owners o WHERE o.user_id IS NOT NULL),
    share AS (
        SELECT user_id, slots FROM (
            SELECT o.user_id, :per_user - greatest(coalesce(b.n, 0), (
                SELECT count(*) FROM webhook_delivery f
                WHERE f.user_id = o.user_id AND f.status IN ('pending', 'failed')
                  AND f.next_attempt_at > now()
                  AND f.claimed_until = f.next_attempt_at)) AS slots
            FROM owners o
            LEFT JOIN unnest(CAST(:busy_users AS text[]), CAST(:busy_counts AS int[]))
                      AS b(user_id, n) ON b.user_id = o.user_id
            WHERE o.user_id IS NOT NULL) free
        WHERE slots > 0),
    candidates AS (
        SELECT c.* FROM share s CROSS JOIN LATERAL (
            SELECT d.id, d.user_id, d.endpoint_id, d.next_attempt_at
            FROM webhook_delivery d
            WHERE d.user_id = s.user_id AND d.status IN ('pending', 'failed')
              AND d.next_attempt_at <= now()
              AND NOT (d.endpoint_id = ANY(CAST(:busy AS uuid[])))
            ORDER BY d.next_attempt_at, d.id
            LIMIT :scan
            FOR UPDATE SKIP LOCKED) c),
    one_each AS (
        SELECT id, user_id, next_attempt_at FROM (
            SELECT id, user_id, next_attempt_at, row_number() OVER (
                PARTITION BY endpoint_id ORDER BY next_attempt_at, id) AS rn
            FROM candidates) per_endpoint
        WHERE rn = 1),
    turns AS (
        SELECT o.id, o.next_attempt_at, s.slots, row_number() OVER (
            PARTITION BY o.user_id ORDER BY o.next_attempt_at, o.id) AS turn
        FROM one_each o JOIN share s ON s.user_id = o.user_id),
    chosen AS (
        SELECT id FROM turns WHERE turn <= slots
        ORDER BY turn, next_attempt_at, id
        LIMIT :lim)
    UPDATE webhook_delivery d
       SET next_attempt_at = now() + make_interval(secs => :lease),
           claimed_until = now() + make_interval(secs => :lease),
           attempt_count = d.attempt_count + 1
    FROM chosen WHERE d.id = chosen.id
    RETURNING {", ".join("d." + c.strip() for c in _DELIVERY.split(","))}
    """
)


async def claim_due(
    session: AsyncSession,
    *,
    limit: int,
    busy_endpoints: Sequence[uuid.UUID],
    busy_users: Mapping[str, int],
    per_user: int,
    lease_s: float,
) -> list[DeliveryRow]:
    """At most `limit` due deliveries, fair across users. Per user at most its free share:
    `per_user` less its deliveries in flight on every deliverer (rows whose claim is live:
    `claimed_until` still equal to `next_attempt_at` and ahead of now; a mark or an expired
    lease ends it), or less `busy_users[user]` (this process's own count) if that is more; at
    most one per endpoint, none for `busy_endpoints` (in flight in this process): a slow
    receiver holds its own slot, a user's slow receivers at most that user's share. Users take
    turns: every user's first row ranks before anyone's second, ties by due time. The claim
    pushes `next_attempt_at` (and `claimed_until`) a lease ahead and counts the attempt. Two
    claims in concurrent transactions do not see each other's rows: deliverers claim through
    `claim_share`, which serialises them.

    Cost: one index probe per user with undelivered rows (the skip scan of `owners`) plus at
    most `4 * per_user` locked rows per user, whatever the size of one user's backlog."""
    rows = await session.execute(
        CLAIM_DUE,
        {
            "busy": list(busy_endpoints),
            "busy_users": list(busy_users),
            "busy_counts": list(busy_users.values()),
            "per_user": per_user,
            "scan": per_user * 4,
            "lim": limit,
            "lease": lease_s,
        },
    )
    return sorted((DeliveryRow(**r._mapping) for r in rows), key=lambda r: r.id)


# One key for every deliverer's claim: claims are short, and serialising them is what makes a
# user's share exact across deliverers (each claim counts what the previous ones committed).
CLAIM_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended('webhook-claim', 0))")


async def claim_share(
    session: AsyncSession,
    *,
    limit: int,
    busy_endpoints: Sequence[uuid.UUID],
    busy_users: Mapping[str, int],
    per_user: int,
    lease_s: float,
) -> list[DeliveryRow]:
    """`claim_due` after the claims' transaction-scoped lock: the deliverer's claim. The lock
    is held until the caller commits, so the next deliverer's claim reads this one's rows as
    in flight and a user never holds more than `per_user` deliveries across all deliverers."""
    await session.execute(CLAIM_LOCK)
    return await claim_due(
        session,
        limit=limit,
        busy_endpoints=busy_endpoints,
        busy_users=busy_users,
        per_user=per_user,
        lease_s=lease_s,
    )


NEXT_DUE = text(
    "SELECT extract(epoch FROM min(next_attempt_at) - now()) AS due_in "
    "FROM webhook_delivery WHERE status IN ('pending', 'failed')"
)


async def next_due_in_s(session: AsyncSession) -> float | None:
    """Seconds until the next undelivered row is due (0 or less: one is due now; a claimed row
    counts at its lease's end), None when none is left (`ix_webhook_delivery_due`): how long
    an idle deliverer may sleep before a retry comes due."""
    due = await session.scalar(NEXT_DUE)
    return None if due is None else float(due)


async def mark_delivered(
    session: AsyncSession, delivery_id: int, *, attempt: int, status_code: int
) -> bool:
    """Only the claim that made `attempt` may record it (a lease that expired was re-claimed)."""
    result = await session.execute(
        text(
            """
            UPDATE webhook_delivery SET status = 'delivered', delivered_at = now(),
                   finished_at = now(), last_status_code = :code, last_error = NULL,
                   claimed_until = NULL
            WHERE id = :id AND attempt_count = :attempt AND status IN ('pending', 'failed')
            """
        ),
        {"id": delivery_id, "attempt": attempt, "code": status_code},
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def mark_attempt_failed(
    session: AsyncSession,
    delivery_id: int,
    *,
    attempt: int,
    status_code: int | None,
    error: str,
    retry_in_s: float,
    retry_for_s: float,
) -> str | None:
    """Back off (`failed`, due in `retry_in_s`), or `dead` once `retry_for_s` have passed since
    the event (or its last replay). Returns the new status (None: not this claim's row)."""
    row = (
        await session.execute(
            text(
                """
                UPDATE webhook_delivery SET
                    status = CASE WHEN coalesce(replayed_at, created_at)
                                       + make_interval(secs => :for_s) <= now()
                                  THEN 'dead' ELSE 'failed' END,
                    finished_at = CASE WHEN coalesce(replayed_at, created_at)
                                            + make_interval(secs => :for_s) <= now()
                                       THEN now() END,
                    next_attempt_at = now() + make_interval(secs => :retry_in),
                    claimed_until = NULL,
                    last_status_code = :code, last_error = left(:err, 300)
                WHERE id = :id AND attempt_count = :attempt AND status IN ('pending', 'failed')
                RETURNING status
                """
            ),
            {
                "id": delivery_id,
                "attempt": attempt,
                "code": status_code,
                "err": error,
                "retry_in": retry_in_s,
                "for_s": retry_for_s,
            },
        )
    ).first()
    return str(row.status) if row else None


async def mark_dead(session: AsyncSession, delivery_id: int, *, attempt: int, error: str) -> None:
    await session.execute(
        text(
            "UPDATE webhook_delivery SET status = 'dead', last_error = left(:err, 300), "
            "finished_at = now(), claimed_until = NULL "
            "WHERE id = :id AND attempt_count = :attempt AND status IN ('pending', 'failed')"
        ),
        {"id": delivery_id, "attempt": attempt, "err": error},
    )


async def purge_finished(session: AsyncSession, *, older_than_s: float, limit: int) -> int:
    """Delete at most `limit` delivered or dead rows finished more than `older_than_s` ago,
    oldest first (the finished-rows index: the cost follows the batch, not the table). Rows a
    concurrent purge holds are skipped. Returns how many were deleted."""
    result = await session.execute(
        text(
            """
            DELETE FROM webhook_delivery WHERE id IN (
                SELECT id FROM webhook_delivery
                WHERE status IN ('delivered', 'dead')
                  AND finished_at < now() - make_interval(secs => :age)
                ORDER BY finished_at LIMIT :lim
                FOR UPDATE SKIP LOCKED)
            """
        ),
        {"age": older_than_s, "lim": limit},
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


# The backlog gauge's read: due rows only, from the due index.
OLDEST_DUE_SQL = (
    "SELECT coalesce(extract(epoch FROM now() - min(next_attempt_at)), 0) "
    "FROM webhook_delivery WHERE status IN ('pending', 'failed') AND next_attempt_at <= now()"
)


async def oldest_due_age_s(session: AsyncSession) -> float:
    """How long the oldest due, undelivered row has waited for a deliverer (0 when none is
    due). Rows backing off or in flight are not due; one user's own backlog counts too."""
    age = await session.scalar(text(OLDEST_DUE_SQL))
    return max(0.0, float(age or 0))


# ---- operators ----------------------------------------------------------------------------------


async def list_deliveries(
    session: AsyncSession, *, status: str | None, before_id: int | None, limit: int
) -> list[DeliveryRow]:
    """Newest first, keyset on id."""
    rows = await session.execute(
        text(
            f"""
            SELECT {_DELIVERY} FROM webhook_delivery
            WHERE (CAST(:status AS text) IS NULL OR status = CAST(:status AS text))
              AND (CAST(:before AS bigint) IS NULL OR id < CAST(:before AS bigint))
            ORDER BY id DESC LIMIT :lim
            """
        ),
        {"status": status, "before": before_id, "lim": limit},
    )
    return [DeliveryRow(**r._mapping) for r in rows]


async def get_delivery(session: AsyncSession, delivery_id: int) -> DeliveryRow | None:
    row = (
        await session.execute(
            text(f"SELECT {_DELIVERY} FROM webhook_delivery WHERE id = :id"), {"id": delivery_id}
        )
    ).first()
    return DeliveryRow(**row._mapping) if row else None


async def replay(session: AsyncSession, delivery_id: int) -> DeliveryRow | None:
    """A delivered, failed or dead delivery goes out again now, with the same webhook-id and a
    fresh retry window. None when missing or not replayable (pending: it goes out anyway)."""
    row = (
        await session.execute(
            text(
                f"""
                UPDATE webhook_delivery SET status = 'pending', next_attempt_at = now(),
                       attempt_count = 0, replayed_at = now(), delivered_at = NULL,
                       finished_at = NULL
                WHERE id = :id AND status = ANY(:ok)
                RETURNING {_DELIVERY}
                """
            ),
            {"id": delivery_id, "ok": list(REPLAYABLE)},
        )
    ).first()
    if row is None:
        return None
    await session.execute(text(f"NOTIFY {NOTIFY_CHANNEL}"))  # the deliverers' wake-up
    return DeliveryRow(**row._mapping)
