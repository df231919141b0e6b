"""What provider fallback (activities/fallback.py) reads and writes beyond the stages' own
statements: a second call number within one attempt, and the model that produced a job's output.

An attempt that moves its call to a fallback entry makes a second call, whose usage row needs an
identity of its own (`ai_usage_log`'s unique (job, attempt, chunk, call)), so that a retried
write of either is still one row. Which model produced a job's output is what its successful
calls' usage rows name (the model as the provider echoed it): no column of `ai_job` holds it.
"""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.jobs import ANSWERING_CALL, Answered

_NEXT = text("UPDATE ai_job SET call_seq = call_seq + 1 WHERE id = :id RETURNING call_seq")
_ANSWERED = text(
    "SELECT c.model, c.structured_output FROM ai_job j "
    f"CROSS JOIN LATERAL ({ANSWERING_CALL}) c WHERE j.id = :id"
)


async def next_call(s: AsyncSession, job_id: uuid.UUID) -> int | None:
    """The job's next call number (None: no such job), in the caller's transaction."""
    got = await s.scalar(_NEXT, {"id": job_id})
    return int(got) if got is not None else None


async def answered(s: AsyncSession, job_id: uuid.UUID) -> Answered:
    """The model of the job's latest successful call (a reused job's: its source's) and the
    structured-output form it asked for (both None: it has none)."""
    row = (await s.execute(_ANSWERED, {"id": job_id})).first()
    return Answered() if row is None else Answered(row.model, row.structured_output)
