"""Flow control's reads of `ai_job` (jobs/flow.py): a create's read of the user's active jobs
with its concurrency key, and the relay's read of the jobs it has not dispatched whose start-by
time or deadline passed. Every function runs in the caller's session and never commits."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.lifecycle import ACTIVE_SQL


@dataclass(frozen=True)
class KeyHolder:
    """An active job of the user with the key: its state, type, workflow, whether the relay
    dispatched it, the mode it was created with and its debounce chain's latest start."""

    id: uuid.UUID
    lifecycle_status: str
    job_type: str
    workflow_id: str
    dispatched: bool
    mode: str | None
    debounce_until: datetime | None


# `ix_ai_job_user_concurrency_key`: the user's active jobs with the key, newest first.
_ACTIVE_WITH_KEY = text(
    f"""
    SELECT id, lifecycle_status, job_type, workflow_id, dispatched_at IS NOT NULL AS dispatched,
           concurrency ->> 'mode' AS mode, debounce_until
    FROM ai_job
    WHERE user_id = :user_id AND concurrency_key = :key AND concurrency_key IS NOT NULL
      AND {ACTIVE_SQL}
    ORDER BY created_at DESC, id DESC
    """
)


async def active_with_key(s: AsyncSession, user_id: str, key: str) -> list[KeyHolder]:
    """The user's queued and running jobs created with `key`, newest first (read under the
    user's create lock: creates with one key are decided one after another)."""
    rows = (await s.execute(_ACTIVE_WITH_KEY, {"user_id": user_id, "key": key})).all()
    return [KeyHolder(**r._mapping) for r in rows]


@dataclass(frozen=True)
class Expiring:
    """A job the relay has not dispatched whose start-by time or deadline passed."""

    id: uuid.UUID
    job_type: str
    deadline: bool  # its deadline passed (else its start-by time)


# `ix_ai_job_expires_undispatched`, `ix_ai_job_deadline_undispatched`. Locked (SKIP LOCKED):
# two relays never expire the same job, and a job a cancel holds is left to it.
_DUE_EXPIRIES = text(
    """
    SELECT id, job_type, coalesce(deadline_at <= now(), false) AS deadline
    FROM ai_job
    WHERE lifecycle_status = 'queued' AND dispatched_at IS NULL
      AND ((expires_at IS NOT NULL AND expires_at <= now())
           OR (deadline_at IS NOT NULL AND deadline_at <= now()))
    ORDER BY least(expires_at, deadline_at)
    LIMIT :lim
    FOR UPDATE SKIP LOCKED
    """
)


async def due_expiries(s: AsyncSession, limit: int) -> list[Expiring]:
    """Up to `limit` queued jobs not dispatched yet whose start-by time or deadline passed,
    earliest first, locked for the caller's transaction."""
    rows = (await s.execute(_DUE_EXPIRIES, {"lim": limit})).all()
    return [Expiring(**r._mapping) for r in rows]
