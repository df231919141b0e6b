"""The reconciler's reads: pages of jobs whose state and Temporal's may disagree (queued jobs
whose enqueue was published, requested cancels, expired locks), one function per phase's fetch
(activities/reconciler.py), each paged by a keyset the caller keeps between passes. Read-only;
every function runs in the caller's session."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.lifecycle import JobLockRow
from db.outbox import ENQUEUE


@dataclass(frozen=True)
class WaitingJob:
    """A queued job whose enqueue was published: what the reconciler checks in Temporal."""

    job_id: uuid.UUID
    workflow_id: str
    created_at: datetime
    event_id: int


@dataclass(frozen=True)
class CancelRequest:
    """A running job whose cancel request is old enough to be re-sent."""

    job_id: uuid.UUID
    workflow_id: str
    requested_at: datetime


async def waiting_jobs_page(
    session: AsyncSession,
    *,
    published_before_s: float,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[WaitingJob]:
    """Reconciler: `queued` jobs whose enqueue was published more than `published_before_s`
    ago (so their workflow should exist and be visible by now), in (created_at, id) order
    after the keyset `after`. Driven by `ix_ai_job_status_created` over queued jobs only,
    then the job's enqueue row by `aggregate_id`: a page costs the same however many
    published rows of finished jobs the outbox still keeps."""
    rows = await session.execute(
        text(
            """
            SELECT j.id AS job_id, j.workflow_id, j.created_at, o.id AS event_id
            FROM ai_job j
            JOIN outbox_event o ON o.aggregate_id = j.id::text AND o.event_type = :enqueue
            WHERE j.lifecycle_status = 'queued'
              AND (CAST(:ac AS timestamptz) IS NULL
                   OR (j.created_at, j.id) > (CAST(:ac AS timestamptz), CAST(:ai AS uuid)))
              AND o.status = 'published'
              AND o.published_at < now() - make_interval(secs => :age)
            ORDER BY j.created_at, j.id LIMIT :lim
            """
        ),
        {
            "enqueue": ENQUEUE,
            "age": published_before_s,
            "ac": after[0] if after else None,
            "ai": after[1] if after else None,
            "lim": limit,
        },
    )
    return [WaitingJob(**r._mapping) for r in rows]


async def cancel_requested_page(
    session: AsyncSession,
    *,
    older_than_s: float,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[CancelRequest]:
    """Reconciler: running jobs with a cancel request older than `older_than_s`, in
    (cancel_requested_at, id) order after the keyset `after`."""
    rows = await session.execute(
        text(
            """
            SELECT id, workflow_id, cancel_requested_at FROM ai_job
            WHERE lifecycle_status = 'running' AND cancel_requested_at IS NOT NULL
              AND cancel_requested_at < now() - make_interval(secs => :age)
              AND (CAST(:ac AS timestamptz) IS NULL
                   OR (cancel_requested_at, id) > (CAST(:ac AS timestamptz),
                                                   CAST(:ai AS uuid)))
            ORDER BY cancel_requested_at, id LIMIT :lim
            """
        ),
        {
            "age": older_than_s,
            "ac": after[0] if after else None,
            "ai": after[1] if after else None,
            "lim": limit,
        },
    )
    return [CancelRequest(r.id, r.workflow_id, r.cancel_requested_at) for r in rows]


async def find_expired_locks(
    session: AsyncSession,
    threshold_s: float,
    *,
    after: tuple[datetime | None, uuid.UUID] | None = None,
    limit: int = 100,
) -> list[JobLockRow]:
    """Running jobs whose lock_until lies more than `threshold_s` in the past, in
    (lock_until, id) order, after the keyset `after`: callers page through all of them."""
    rows = await session.execute(
        text(
            """
            SELECT id, job_type, queue_name, workflow_id, locked_by, lock_until,
                   cancel_requested_at
            FROM ai_job
            WHERE lifecycle_status = 'running'
              AND lock_until < now() - make_interval(secs => :th)
              AND (CAST(:al AS timestamptz) IS NULL OR (lock_until, id) > (:al, :ai))
            ORDER BY lock_until, id LIMIT :lim
            """
        ),
        {
            "th": threshold_s,
            "lim": limit,
            "al": after[0] if after else None,
            "ai": after[1] if after else None,
        },
    )
    return [JobLockRow(**r._mapping) for r in rows]
