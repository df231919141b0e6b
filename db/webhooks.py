"""Webhook endpoints and their deliveries (see docs/webhooks.md).

A delivery row is written by the relay, in the transaction that marks a job's domain event
(`ai.job.completed|failed|cancelled`) published: one row per matching endpoint of the job's owner
(`fan_out`). The deliverer claims due rows under `FOR UPDATE SKIP LOCKED`, pushing
`next_attempt_at` one lease ahead, so a deliverer that dies mid-request costs a retry after the
lease, never a delivery, and a row is never claimed by two deliverers at once. No transaction is
open while a receiver is called.

Fairness: the claim serves users round-robin (each owner's oldest due row first, then each
one's second ...), never one queue in due order across users, and never more of a user's rows
than that user's free share of the deliverer's slots: one user's backlog cannot queue another
user's delivery behind it. Finished rows (delivered, dead) are purged after their retention.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from db.outbox import CANCELLED, COMPLETED, FAILED

# The API validates against these Literals; the tuples are the same values for SQL. A type
# checker cannot build a Literal from constants, so the import-time check keeps them one fact.
WebhookEvent = Literal[
    "ai.job.completed", "ai.job.failed", "ai.job.cancelled", "ai.schedule.run_refused"
]
DeliveryStatus = Literal["pending", "delivered", "failed", "dead"]
WEBHOOK_EVENTS: tuple[str, ...] = get_args(WebhookEvent)
DELIVERY_STATUSES: tuple[str, ...] = get_args(DeliveryStatus)
# The job events, an endpoint's default subscription. A schedule's refused run
# (jobs/schedules.py) is opt-in, and delivered from its own rows, not by FAN_OUT.
JOB_EVENTS: tuple[str, ...] = WEBHOOK_EVENTS[:3]
if JOB_EVENTS != (COMPLETED, FAILED, CANCELLED):
    raise RuntimeError("WebhookEvent must list the outbox's terminal event names")
REPLAYABLE = ("delivered", "failed", "dead")
# Guards the cast of an event's aggregate id: a malformed one fans out to nothing.
_UUID_RE = "^[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$"


@dataclass(frozen=True)
class EndpointRow:
    id: uuid.UUID
    user_id: str
    url: str
    event_types: list[str]
    key_id: str
    secret_ciphertext: bytes
    previous_key_id: str | None
    previous_secret_ciphertext: bytes | None
    previous_valid_until: datetime | None
    created_at: datetime
    deleted_at: datetime | None


# The statements of this module interpolate only its own constants (these column lists, a fixed
# " FOR UPDATE"); every value a caller passes (ids, URLs, statuses, limits) is a bind parameter.
_ENDPOINT = (
    "id, user_id, url, event_types, key_id, secret_ciphertext, previous_key_id, "
    "previous_secret_ciphertext, previous_valid_until, created_at, deleted_at"
)


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


_DELIVERY = (
    "id, endpoint_id, user_id, event_id, job_id, webhook_id, event_type, occurred_at, status, "
    "attempt_count, next_attempt_at, last_status_code, last_error, created_at, replayed_at, "
    "delivered_at, finished_at"
)


# ---- endpoints -------------------------------------------------------------------------------


async def insert_endpoint(
    session: AsyncSession,
    *,
    endpoint_id: uuid.UUID,
    user_id: str,
    url: str,
    event_types: Sequence[str],
    key_id: str,
    ciphertext: bytes,
) -> EndpointRow:
    row = (
        await session.execute(
            text(
                f"""
                INSERT INTO webhook_endpoint (id, user_id, url, event_types, key_id,
                                              secret_ciphertext, created_at)
                VALUES (:id, :uid, :url, :types, :kid, :blob, now())
                RETURNING {_ENDPOINT}
                """
            ).bindparams(bindparam("types", type_=JSONB)),
            {
                "id": endpoint_id,
                "uid": user_id,
                "url": url,
                "types": list(event_types),
                "kid": key_id,
                "blob": ciphertext,
            },
        )
    ).one()
    return EndpointRow(**row._mapping)


async def lock_user_endpoints(session: AsyncSession, user_id: str) -> int:
    """Serialise endpoint registrations of one user until the transaction ends (an advisory
    lock keyed by the user id) and return how many live endpoints the user has: a
    count-then-insert under it cannot overshoot the per-user cap, however many requests race."""
    await session.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended('webhook_endpoint:' || :u, 0))"),
        {"u": user_id},
    )
    n = await session.scalar(
        text("SELECT count(*) FROM webhook_endpoint WHERE user_id = :u AND deleted_at IS NULL"),
        {"u": user_id},
    )
    return int(n or 0)


async def get_endpoint(
    session: AsyncSession, endpoint_id: uuid.UUID, *, for_update: bool = False
) -> EndpointRow | None:
    lock = " FOR UPDATE" if for_update else ""  # a constant clause, never a caller's text
    row = (
        await session.execute(
            text(f"SELECT {_ENDPOINT} FROM webhook_endpoint WHERE id = :id{lock}"),
            {"id": endpoint_id},
        )
    ).first()
    return EndpointRow(**row._mapping) if row else None


async def list_endpoints(session: AsyncSession, user_id: str) -> list[EndpointRow]:
    rows = await session.execute(
        text(
            f"SELECT {_ENDPOINT} FROM webhook_endpoint "
            "WHERE user_id = :uid AND deleted_at IS NULL ORDER BY created_at, id"
        ),
        {"uid": user_id},
    )
    return [EndpointRow(**r._mapping) for r in rows]


async def delete_endpoint(session: AsyncSession, user_id: str, endpoint_id: uuid.UUID) -> bool:
    """Soft delete (deliveries keep their history); pending deliveries are dropped (dead)."""
    result = await session.execute(
        text(
            "UPDATE webhook_endpoint SET deleted_at = now() "
            "WHERE id = :id AND user_id = :uid AND deleted_at IS NULL"
        ),
        {"id": endpoint_id, "uid": user_id},
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        return False
    await session.execute(
        text(
            "UPDATE webhook_delivery SET status = 'dead', last_error = 'endpoint deleted', "
            "finished_at = now() WHERE endpoint_id = :id AND status IN ('pending', 'failed')"
        ),
        {"id": endpoint_id},
    )
    return True


async def rotate_secret(
    session: AsyncSession,
    endpoint_id: uuid.UUID,
    *,
    key_id: str,
    ciphertext: bytes,
    previous_key_id: str,
    previous_ciphertext: bytes,
    grace_s: float,
) -> EndpointRow:
    row = (
        await session.execute(
            text(
                f"""
                UPDATE webhook_endpoint SET key_id = :kid, secret_ciphertext = :blob,
                       previous_key_id = :pkid, previous_secret_ciphertext = :pblob,
                       previous_valid_until = now() + make_interval(secs => :grace)
                WHERE id = :id
                RETURNING {_ENDPOINT}
                """
            ),
            {
                "id": endpoint_id,
                "kid": key_id,
                "blob": ciphertext,
                "pkid": previous_key_id,
                "pblob": previous_ciphertext,
                "grace": grace_s,
            },
        )
    ).one()
    return EndpointRow(**row._mapping)


# ---- fan-out (the relay's publish transaction) ------------------------------------------------


# One delivery per published domain event and matching live endpoint of the job's owner.
# Idempotent (unique endpoint and event): a row published twice fans out once.
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
    """
)


def fan_out_params(event_ids: Sequence[int]) -> dict[str, object]:
    return {"ids": list(event_ids), "types": list(WEBHOOK_EVENTS), "uuid_re": _UUID_RE}


async def fan_out(session: AsyncSession, event_ids: Sequence[int]) -> int:
    """`FAN_OUT` for these outbox rows; how many deliveries it created."""
    if not event_ids:
        return 0
    result = await session.execute(FAN_OUT, fan_out_params(event_ids))
    return int(result.rowcount)  # type: ignore[attr-defined]


# ---- the deliverer ----------------------------------------------------------------------------


async def claim_due(
    session: AsyncSession,
    *,
    limit: int,
    busy_endpoints: Sequence[uuid.UUID],
    busy_users: Mapping[str, int],
    per_user: int,
    lease_s: float,
) -> list[DeliveryRow]:
    """At most `limit` due deliveries, fair across users. Per user at most
    `per_user - busy_users[user]` rows (its free share of this deliverer's slots) and at most
    one per endpoint, none for `busy_endpoints` (in flight in this process): a slow receiver
    holds its own slot, a user's slow receivers at most that user's share. Users take turns:
    every user's first row ranks before anyone's second, ties by due time. The claim pushes
    `next_attempt_at` a lease ahead and counts the attempt.

    Cost: one index probe per user with undelivered rows (the skip scan of `owners`) plus at
    most `4 * per_user` locked rows per user, whatever the size of one user's backlog."""
    rows = await session.execute(
        text(
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
                SELECT o.user_id, :per_user - coalesce(b.n, 0) AS slots
                FROM owners o
                LEFT JOIN unnest(CAST(:busy_users AS text[]), CAST(:busy_counts AS int[]))
                          AS b(user_id, n) ON b.user_id = o.user_id
                WHERE o.user_id IS NOT NULL AND :per_user - coalesce(b.n, 0) > 0),
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
                   attempt_count = d.attempt_count + 1
            FROM chosen WHERE d.id = chosen.id
            RETURNING {", ".join("d." + c.strip() for c in _DELIVERY.split(","))}
            """
        ),
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


async def mark_delivered(
    session: AsyncSession, delivery_id: int, *, attempt: int, status_code: int
) -> bool:
    """Only the claim that made `attempt` may record it (a lease that expired was re-claimed)."""
    result = await session.execute(
        text(
            """
            UPDATE webhook_delivery SET status = 'delivered', delivered_at = now(),
                   finished_at = now(), last_status_code = :code, last_error = NULL
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
            "finished_at = now() "
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
    return DeliveryRow(**row._mapping) if row else None
