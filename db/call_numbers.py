"""A job's provider calls numbered beyond its attempt's take: an attempt that moves its call to
a fallback entry (activities/fallback.py) makes a second call, whose usage row needs an identity
of its own (`ai_usage_log`'s unique (job, attempt, chunk, call)), so that a retried write of
either is still one row."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

_NEXT = text("UPDATE ai_job SET call_seq = call_seq + 1 WHERE id = :id RETURNING call_seq")


async def next_call(s: AsyncSession, job_id: uuid.UUID) -> int | None:
    """The job's next call number (None: no such job), in the caller's transaction."""
    got = await s.scalar(_NEXT, {"id": job_id})
    return int(got) if got is not None else None
