"""Private copies of a job's input: the snapshot EXECUTE reads and its expiry (the purge of a
finished job's private data is db/retention.py's). Every function runs in the caller's session
and never commits."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from db.lifecycle import ACTIVE_SQL
from db.outbox import INSERT_NOTIFY_SQL, insert_params

_INSERT_SQL = """
    INSERT INTO ai_job_snapshot (job_id, content, redaction_version, expires_at, created_at)
    VALUES (:id, :c, :rv, now() + make_interval(days => :ttl), now())
"""
_INSERT = text(_INSERT_SQL).bindparams(bindparam("c", type_=JSONB))
# How many of the job's user's jobs are active (queued or running) as it is created, this one
# included, counted up to a bound (the active partial index serves it): the relay gives a user's
# first few active jobs a larger fairness weight (docs/operations.md "Fairness").
USER_ACTIVE_BOUND = 1000
_USER_ACTIVE_SQL = f"""
    (SELECT count(*) FROM (
        SELECT 1 FROM ai_job a
        WHERE a.user_id = (SELECT j.user_id FROM ai_job j WHERE j.id = :id)
          AND a.{ACTIVE_SQL}
        LIMIT {USER_ACTIVE_BOUND}) active)
"""
# A create's snapshot and its enqueue row (waking the relays) in one statement; the enqueue
# row's payload gets the user's active count as `userActive`. The snapshot's INSERT is a
# data-modifying WITH: PostgreSQL runs it to completion whether or not the enqueue row is
# inserted, in the same transaction. The job's row, written by an earlier statement of the
# transaction, is counted.
_ENQUEUE_SQL = INSERT_NOTIFY_SQL.replace(
    ":payload,",
    f"jsonb_set(:payload, '{{userActive}}', to_jsonb({_USER_ACTIVE_SQL})),",
    1,
)
if _ENQUEUE_SQL == INSERT_NOTIFY_SQL:  # the payload's place in the outbox insert moved
    raise RuntimeError("db/snapshots.py: the outbox insert no longer takes `:payload,`")
_INSERT_WITH_ENQUEUE = text(f"WITH snapshot AS ({_INSERT_SQL}) {_ENQUEUE_SQL}").bindparams(
    bindparam("c", type_=JSONB),
    bindparam("payload", type_=JSONB),
    bindparam("trace_context", type_=JSONB),
)


async def insert_snapshot(
    session: AsyncSession,
    job_id: uuid.UUID,
    content: dict[str, Any],
    redaction_version: str,
    ttl_days: int,
) -> None:
    await session.execute(
        _INSERT, {"id": job_id, "c": content, "rv": redaction_version, "ttl": ttl_days}
    )


async def insert_snapshot_and_enqueue(
    session: AsyncSession,
    job_id: uuid.UUID,
    content: dict[str, Any],
    redaction_version: str,
    ttl_days: int,
    *,
    event_type: str,
    aggregate_type: str,
    aggregate_id: str,
    dedupe_key: str,
    payload: dict[str, Any],
    trace_context: dict[str, str] | None = None,
    due_at: datetime | None = None,
) -> int | None:
    """`insert_snapshot` and db/outbox.py's `insert` (with its NOTIFY) in one round trip: the
    enqueue row's id, or None when its dedupe key existed (as `insert` answers; the snapshot is
    written either way, and the caller's rollback takes it back). `due_at`: the enqueue row
    is not claimed before then (a delayed job's)."""
    row = (
        await session.execute(
            _INSERT_WITH_ENQUEUE,
            {
                "id": job_id,
                "c": content,
                "rv": redaction_version,
                "ttl": ttl_days,
                **insert_params(
                    event_type=event_type,
                    aggregate_type=aggregate_type,
                    aggregate_id=aggregate_id,
                    dedupe_key=dedupe_key,
                    payload=payload,
                    trace_context=trace_context,
                    due_at=due_at,
                ),
            },
        )
    ).first()
    return int(row.id) if row else None


async def delete_expired_snapshots(session: AsyncSession, *, limit: int = 1000) -> int:
    result = await session.execute(
        text(
            """
            DELETE FROM ai_job_snapshot WHERE job_id IN (
                SELECT job_id FROM ai_job_snapshot WHERE expires_at <= now() LIMIT :lim)
            """
        ),
        {"lim": limit},
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
