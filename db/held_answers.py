"""A provider's answer kept while its moderation could not run (`ai_job.held_answer`, or the
chunk's): written with the failed attempt's bookkeeping, so the next attempt moderates it again
instead of calling the provider (jobs/attempt_start.py `start`), and let go by the settlement
that stores the output (db/lifecycle.py `SETTLE_ATTEMPT`, db/attempts.py). Private data: the
purge clears it (db/retention.py). Every function runs in the caller's transaction."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

_JOB = text("UPDATE ai_job SET held_answer = :a, updated_at = now() WHERE id = :id")
_CHUNK = text(
    "UPDATE ai_job_chunk SET held_answer = :a WHERE job_id = :id AND chunk_no = :n "
    "AND status <> 'succeeded'"
)


async def hold(s: AsyncSession, job_id: uuid.UUID, chunk_no: int | None, answer: str) -> None:
    """Keep `answer` for the job's (or its chunk's) next attempt."""
    if chunk_no is None:
        await s.execute(_JOB, {"id": job_id, "a": answer})
    else:
        await s.execute(_CHUNK, {"id": job_id, "n": chunk_no, "a": answer})


_RELEASE_JOB = text("UPDATE ai_job SET held_answer = NULL WHERE id = :id")
_RELEASE_CHUNK = text(
    "UPDATE ai_job_chunk SET held_answer = NULL WHERE job_id = :id AND chunk_no = :n"
)


async def release(s: AsyncSession, job_id: uuid.UUID, chunk_no: int | None) -> None:
    """Let a held answer go (it failed its guardrails: the next attempt calls again)."""
    if chunk_no is None:
        await s.execute(_RELEASE_JOB, {"id": job_id})
    else:
        await s.execute(_RELEASE_CHUNK, {"id": job_id, "n": chunk_no})
