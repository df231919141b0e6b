"""A job's output, stored by the lock owner of its running attempt (EXECUTE's merge of a long
source's chunks, a batch item's collect, a reuse's copy); the one-call path stores its output
inside its settlement instead (db/lifecycle.py `SETTLE_ATTEMPT`)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession


async def store_output(
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    owner: str,
    output: dict[str, Any],
    output_hash: str,
    progress: int,
    flagged: int | None = None,
) -> bool:
    """Only the lock owner of a running job may store an output (with the items moderation
    dropped). Progress changes, so the job's listeners are notified (`ai_job_changed`, in this
    transaction)."""
    result = await session.execute(
        text(
            """
            UPDATE ai_job SET output = :out, output_hash = :h,
                   flagged_items = CAST(:flagged AS integer),
                   progress = greatest(progress, :p), updated_at = now()
            WHERE id = :id AND lifecycle_status = 'running'
              AND split_part(locked_by, '/', 1) = :owner
            RETURNING pg_notify('ai_job_changed', id::text) IS NULL AS notified
            """
        ).bindparams(bindparam("out", type_=JSONB)),
        {
            "id": job_id,
            "out": output,
            "h": output_hash,
            "p": progress,
            "owner": owner,
            "flagged": flagged,
        },
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]
