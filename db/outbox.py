"""The transactional outbox (docs/architecture.md).

Rows are inserted in the caller's transaction. Relays claim batches by compare-and-set
(`pending → processing` under `FOR UPDATE SKIP LOCKED`, so concurrent claimers never see the same
row), dispatch them outside any transaction, then mark them published or failed. A claimer that
dies leaves `processing` rows behind; `release_expired` puts them back after the lock TTL, so the
crash window costs latency, never a job. Starting a workflow twice is harmless (the workflow id is
the job's), which is what makes the at-least-once dispatch safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import TextClause, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

ENQUEUE = "ai.job.enqueue"
COMPLETED = "ai.job.completed"
FAILED = "ai.job.failed"
CANCELLED = "ai.job.cancelled"
NOTIFY_CHANNEL = "ai_outbox"
# The specification's outbox statuses: a row whose counted claims reach MAX_ATTEMPTS is parked
# as `dead` (it used up its attempts; the reconciler revives a dead enqueue whose job still
# waits); `failed` is a row that can never be dispatched (a malformed payload), parked at its
# first claim and never retried by the engine (only an operator's requeue sends it again).
MAX_ATTEMPTS = 3
MAX_BACKOFF_S = 300.0


# A job's domain events: one of each per job at most (`job_event_dedupe_key`), written only by
# jobs/lifecycle.py in the transaction that ends the job.
JOB_EVENTS = (COMPLETED, FAILED, CANCELLED)


def job_event_dedupe_key(event_type: str, job_id: object) -> str:
    """A job event's unique key: the event and the job, so a repeated ending writes nothing."""
    return f"{event_type}:{job_id}"


def enqueue_dedupe_key(job_id: object) -> str:
    """The enqueue row's unique key: derived from the job id alone, so no client-chosen
    Idempotency-Key (or user id) can ever collide with another job's enqueue. Idempotency of
    creation lives on `ai_job` (user, job type, key)."""
    return f"{ENQUEUE}:{job_id}"


@dataclass(frozen=True)
class OutboxRow:
    id: int
    event_type: str
    aggregate_type: str
    aggregate_id: str
    dedupe_key: str
    payload: dict[str, Any]
    status: str
    attempt_count: int
    available_at: datetime
    locked_by: str | None
    locked_at: datetime | None
    last_error: str | None
    published_at: datetime | None
    created_at: datetime
    revive_count: int = 0
    # W3C trace context of the request that wrote the row (see jobs/tracecontext.py).
    trace_context: dict[str, str] | None = None


# A job id as the enqueue row's aggregate_id spells it; anything else names no job.
UUID_RE = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"

# The outbox_event columns an OutboxRow is read from: its fields, in order. The statements below
# interpolate only this module's constants (column lists, the channel name); every value a caller
# passes is a bind parameter.
COLUMNS = ", ".join(f.name for f in fields(OutboxRow))
# NOTIFY takes no bind parameter; the channel is this module's constant.
NOTIFY = text(f"NOTIFY {NOTIFY_CHANNEL}")

_INSERT = text(
    """
    INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,
                              status, attempt_count, available_at, created_at, trace_context)
    VALUES (:event_type, :aggregate_type, :aggregate_id, :dedupe_key, :payload,
            'pending', 0, coalesce(CAST(:due_at AS timestamptz), now()), now(), :trace_context)
    ON CONFLICT (dedupe_key) DO NOTHING
    RETURNING id
    """
).bindparams(bindparam("payload", type_=JSONB), bindparam("trace_context", type_=JSONB))
# The same insert waking the relays in the same round trip: pg_notify runs for an inserted row
# only (a duplicate returns nothing), and is transactional like NOTIFY.
_INSERT_NOTIFY = text(
    str(_INSERT.text).replace(
        "RETURNING id", f"RETURNING id, pg_notify('{NOTIFY_CHANNEL}', '') IS NULL AS notified"
    )
).bindparams(bindparam("payload", type_=JSONB), bindparam("trace_context", type_=JSONB))
# Its text, for a statement that writes another row in the same round trip (a create's
# snapshot: db/snapshots.py `insert_snapshot_and_enqueue`).
INSERT_NOTIFY_SQL = str(_INSERT_NOTIFY.text)
# A job's domain event wakes the relays only when its publishing is awaited: its owner has a
# live webhook endpoint for it (the fan-out is in the publish), or the owner has jobs held by
# the dispatch window (this ending may make room). Any other job event goes out with the
# relays' next claim or poll: a plain job's ending costs no relay transaction of its own.
# Both probes are index lookups by user (`webhook_endpoint`'s, `ix_ai_job_undispatched`).
_INSERT_JOB_EVENT = text(
    str(_INSERT.text).replace(
        "RETURNING id",
        f"""RETURNING id, (CASE WHEN EXISTS (
                SELECT 1 FROM ai_job j JOIN webhook_endpoint e ON e.user_id = j.user_id
                WHERE j.id = CAST(:aggregate_id AS uuid) AND e.deleted_at IS NULL
                  AND e.event_types ? :event_type)
              OR EXISTS (
                SELECT 1 FROM ai_job j JOIN ai_job h ON h.user_id = j.user_id
                WHERE j.id = CAST(:aggregate_id AS uuid)
                  AND h.dispatched_at IS NULL AND h.lifecycle_status = 'queued')
            THEN pg_notify('{NOTIFY_CHANNEL}', '') END) IS NULL AS notified""",
    )
).bindparams(bindparam("payload", type_=JSONB), bindparam("trace_context", type_=JSONB))


async def insert(
    session: AsyncSession,
    *,
    event_type: str,
    aggregate_type: str,
    aggregate_id: str,
    dedupe_key: str,
    payload: dict[str, Any],
    notify: bool = True,
    trace_context: dict[str, str] | None = None,
) -> int | None:
    """Insert in the caller's transaction. A duplicate dedupe_key is an idempotent no-op
    (returns None). NOTIFY is transactional: relays are woken only if the row commits.
    `trace_context` (W3C headers) lets the relay continue the writer's trace."""
    params = insert_params(
        event_type=event_type,
        aggregate_type=aggregate_type,
        aggregate_id=aggregate_id,
        dedupe_key=dedupe_key,
        payload=payload,
        trace_context=trace_context,
    )
    row = (await session.execute(_INSERT_NOTIFY if notify else _INSERT, params)).first()
    return int(row.id) if row else None


def insert_params(
    *,
    event_type: str,
    aggregate_type: str,
    aggregate_id: str,
    dedupe_key: str,
    payload: dict[str, Any],
    trace_context: dict[str, str] | None = None,
    due_at: datetime | None = None,
) -> dict[str, Any]:
    """The parameters of `insert`'s statement (`INSERT_NOTIFY_SQL`), for it and for a
    statement that sends it with another row's insert. `due_at`: the row is not claimed
    before then (a delayed job's enqueue); None: now."""
    return {
        "event_type": event_type,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate_id,
        "dedupe_key": dedupe_key,
        "payload": payload,
        "trace_context": trace_context,
        "due_at": due_at,
    }


async def insert_job_event(
    session: AsyncSession,
    event_type: str,
    job_id: object,
    payload: dict[str, Any],
) -> int | None:
    """A job's domain event (`JOB_EVENTS`), in the caller's transaction: the one that ends
    the job (jobs/lifecycle.py is the only caller). A second write of the same event for the
    same job is a no-op (None). It wakes the relays (`NOTIFY ai_outbox`) only when the job's
    owner has a webhook endpoint for it or jobs held by the dispatch window (`_INSERT_JOB_EVENT`);
    otherwise the relay takes it with its next claim or poll. Event streams are woken by the
    terminal CAS's own `ai_job_changed` notification."""
    stmt, values = job_event_statement(event_type, job_id, payload)
    row = (await session.execute(stmt, values)).first()
    return int(row.id) if row else None


def job_event_statement(
    event_type: str, job_id: object, payload: dict[str, Any]
) -> tuple[TextClause, dict[str, Any]]:
    """`insert_job_event`'s statement and parameters, for a caller that pipelines it
    (db/pipeline.py): it returns the new row's id, or no row for a duplicate."""
    if event_type not in JOB_EVENTS:
        raise ValueError(f"{event_type!r} is not a job event")
    return _INSERT_JOB_EVENT, {
        "event_type": event_type,
        "aggregate_type": "AiJob",
        "aggregate_id": str(job_id),
        "dedupe_key": job_event_dedupe_key(event_type, job_id),
        "payload": payload,
        "trace_context": None,
        "due_at": None,
    }


# Only the claimer's own `processing` rows: a row released and re-claimed by another relay
# meanwhile is that relay's to mark.
MARK_PUBLISHED = text(
    """
    UPDATE outbox_event SET status = 'published', published_at = now(),
           locked_by = NULL, locked_at = NULL
    WHERE id = ANY(:ids) AND status = 'processing' AND locked_by = :owner
    """
)


async def mark_published(session: AsyncSession, ids: Sequence[int], *, owner: str) -> int:
    """`MARK_PUBLISHED`; how many rows it marked."""
    if not ids:
        return 0
    result = await session.execute(MARK_PUBLISHED, {"ids": list(ids), "owner": owner})
    return int(result.rowcount)  # type: ignore[attr-defined]


async def mark_failed(
    session: AsyncSession,
    event_id: int,
    *,
    owner: str,
    error: str,
    base_backoff_s: float = 1.0,
    max_attempts: int = MAX_ATTEMPTS,
    max_backoff_s: float = MAX_BACKOFF_S,
    count_attempt: bool = True,
) -> str | None:
    """Back to pending with capped exponential backoff, or `dead` after `max_attempts`
    claims (attempts used up). `count_attempt=False` (the dispatch target was unreachable,
    e.g. Temporal is down) gives the claim back: an outage of any length never exhausts a row.
    Returns the new status (None if the row was no longer ours)."""
    row = (
        await session.execute(
            text(
                """
                UPDATE outbox_event SET
                    attempt_count = CASE WHEN :counted THEN attempt_count
                                         ELSE greatest(attempt_count - 1, 0) END,
                    status = CASE WHEN :counted AND attempt_count >= :max THEN 'dead'
                                  ELSE 'pending' END,
                    available_at = now() + make_interval(secs => least(:cap,
                        :base * power(2, least(greatest(attempt_count - 1, 0), 20)))),
                    last_error = left(:err, 2000), locked_by = NULL, locked_at = NULL
                WHERE id = :id AND status = 'processing' AND locked_by = :owner
                RETURNING status
                """
            ),
            {
                "id": event_id,
                "owner": owner,
                "err": error,
                "base": base_backoff_s,
                "max": max_attempts,
                "cap": max_backoff_s,
                "counted": count_attempt,
            },
        )
    ).first()
    return str(row.status) if row else None


async def mark_undispatchable(
    session: AsyncSession, event_id: int, *, owner: str, error: str
) -> bool:
    """A row that can never be dispatched (a malformed payload): `failed` at this first claim,
    alone (the rest of its batch goes on), and never retried: no claim, no reconciler revival;
    only an operator's requeue sends it again."""
    result = await session.execute(
        text(
            """
            UPDATE outbox_event SET status = 'failed', last_error = left(:err, 2000),
                   locked_by = NULL, locked_at = NULL
            WHERE id = :id AND status = 'processing' AND locked_by = :owner
            """
        ),
        {"id": event_id, "owner": owner, "err": error},
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


# `processing` rows whose claimer went silent for `:ttl` seconds go back to pending (their ids
# back: the relay pipelines it in its claim's round trip, db/relay.py).
RELEASE_EXPIRED = text(
    """
    UPDATE outbox_event SET status = 'pending', locked_by = NULL, locked_at = NULL
    WHERE status = 'processing' AND locked_at < now() - make_interval(secs => :ttl)
    RETURNING id
    """
)


async def release_expired(session: AsyncSession, *, ttl_s: float) -> int:
    """`RELEASE_EXPIRED` in the caller's transaction; how many rows went back."""
    result = await session.execute(RELEASE_EXPIRED, {"ttl": ttl_s})
    return int(result.rowcount)  # type: ignore[attr-defined]


def retry_in_s(attempt_count: int, *, base_s: float = 1.0, cap_s: float = MAX_BACKOFF_S) -> float:
    """How long `mark_failed` (with its default backoff) puts a row back for, given the row's
    `attempt_count` as claimed: when the relay that failed it should look again."""
    return float(min(cap_s, base_s * 2 ** min(max(attempt_count - 1, 0), 20)))


async def delete_published(
    session: AsyncSession, *, older_than_days: int, limit: int = 5000
) -> int:
    """Retention: published rows are history once their effect is done. A page at a time
    (the partial index on published_at serves it), so a pass never holds long locks."""
    result = await session.execute(
        text(
            """
            DELETE FROM outbox_event WHERE id IN (
                SELECT id FROM outbox_event
                WHERE status = 'published'
                  AND published_at < now() - make_interval(days => :d)
                ORDER BY published_at LIMIT :lim)
            """
        ),
        {"d": older_than_days, "lim": limit},
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


async def republish_enqueue(session: AsyncSession, event_id: int) -> bool:
    """Reconciler: a published enqueue whose workflow does not exist goes out again (not the
    operator's `outbox_admin.requeue`, which serves dead, failed and pending rows)."""
    result = await session.execute(
        text(
            """
            UPDATE outbox_event SET status = 'pending', available_at = now(),
                   published_at = NULL, attempt_count = 0
            WHERE id = :id AND status = 'published'
            """
        ),
        {"id": event_id},
    )
    if result.rowcount:  # type: ignore[attr-defined]
        await session.execute(NOTIFY)
    return bool(result.rowcount)  # type: ignore[attr-defined]
