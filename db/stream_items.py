"""`ai_job_stream_item`: the items of a one-call job's answer while the provider still writes it.

EXECUTE writes each item that became complete and valid mid-stream (`publish`, a batch per
statement), keyed by (job, attempt, ordinal), and marks them retracted (`retract`) when the
final validation rejects them or their attempt fails; readers (the event streams, the
artifacts page) read them back (`rows`, `live`). Every write notifies `ai_job_changed` in the
same statement, so a woken reader finds the rows committed. Rows carry job content: they are
private data like `ai_job.output`, and go with their job (ON DELETE CASCADE).

`publish` is EXECUTE's hot transaction while the provider writes: BEGIN, the statement and
COMMIT in one round trip (db/pipeline.py), on the caller's sessionmaker. The other functions
run in the caller's transaction and never commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from db import pipeline
from db.session import SessionMaker

# One statement per batch: the rows (only while the job runs: a job that ended, or was taken
# from this attempt's workflow, gets no more items), the items of earlier attempts retracted
# (this attempt's replace them), and the notification. ON CONFLICT: a retried batch is one.
PUBLISH = """
WITH job AS (
    SELECT id FROM ai_job WHERE id = :job_id AND lifecycle_status = 'running'
), ins AS (
    INSERT INTO ai_job_stream_item (job_id, attempt_no, ordinal, content)
    SELECT job.id, :attempt, x.ordinal, x.content
    FROM job, jsonb_to_recordset(:items) AS x(ordinal int, content jsonb)
    ON CONFLICT DO NOTHING
    RETURNING 1
), old AS (
    UPDATE ai_job_stream_item SET retracted_at = clock_timestamp()
    WHERE job_id = :job_id AND attempt_no < :attempt AND retracted_at IS NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM ins) AS written,
       pg_notify('ai_job_changed', CAST(:job_id AS text)) IS NULL AS notified
"""

RETRACT = """
WITH r AS (
    UPDATE ai_job_stream_item SET retracted_at = clock_timestamp()
    WHERE job_id = :job_id AND attempt_no <= :attempt AND retracted_at IS NULL
      AND (attempt_no < :attempt OR :all_of_it OR ordinal = ANY(:ordinals))
    RETURNING 1
)
SELECT (SELECT count(*) FROM r) AS retracted,
       pg_notify('ai_job_changed', CAST(:job_id AS text)) IS NULL AS notified
"""


_PUBLISH = text(PUBLISH).bindparams(bindparam("items", type_=JSONB))


async def publish(
    sm: SessionMaker, job_id: uuid.UUID, attempt: int, items: Sequence[tuple[int, Any]]
) -> int:
    """Write `items` ((ordinal, content) pairs) of `attempt`, retract earlier attempts' items,
    notify, in one transaction and one round trip (EXECUTE's hot path while the provider
    writes); how many rows were written (0: the job no longer runs, or they were written)."""
    payload = [{"ordinal": n, "content": c} for n, c in items]
    params = {"job_id": job_id, "attempt": attempt, "items": payload}
    [rows] = await pipeline.run(sm, [(_PUBLISH, params)], commit=True)
    return int(rows[0]["written"])


async def retract(
    s: AsyncSession,
    job_id: uuid.UUID,
    attempt: int,
    ordinals: Sequence[int] = (),
    *,
    all_of_it: bool = False,
) -> int:
    """Mark retracted the items of `attempt` at `ordinals` (every one with `all_of_it`) and
    any left of earlier attempts; notify when any was. How many were."""
    got = await s.execute(
        text(RETRACT),
        {"job_id": job_id, "attempt": attempt, "ordinals": list(ordinals), "all_of_it": all_of_it},
    )
    return int(got.scalar_one())


@dataclass(frozen=True)
class StreamItemRow:
    attempt_no: int
    ordinal: int
    content: dict[str, Any]
    created_at: datetime
    retracted_at: datetime | None


async def rows(s: AsyncSession, job_id: uuid.UUID) -> list[StreamItemRow]:
    """Every item row of the job (a few dozen at most: one answer's list per attempt), in the
    order they were written."""
    got = await s.execute(
        text(
            """
            SELECT attempt_no, ordinal, content, created_at, retracted_at
            FROM ai_job_stream_item WHERE job_id = :job_id
            ORDER BY attempt_no, ordinal
            """
        ),
        {"job_id": job_id},
    )
    return [
        StreamItemRow(r.attempt_no, r.ordinal, dict(r.content), r.created_at, r.retracted_at)
        for r in got
    ]


async def live(s: AsyncSession, job_id: uuid.UUID) -> list[StreamItemRow]:
    """The items a reader may show now: those of the job's latest attempt not retracted, in
    their answer's order."""
    got = await s.execute(
        text(
            """
            SELECT attempt_no, ordinal, content, created_at, retracted_at
            FROM ai_job_stream_item
            WHERE job_id = :job_id AND retracted_at IS NULL
              AND attempt_no = (SELECT max(attempt_no) FROM ai_job_stream_item
                                WHERE job_id = :job_id)
            ORDER BY ordinal
            """
        ),
        {"job_id": job_id},
    )
    return [
        StreamItemRow(r.attempt_no, r.ordinal, dict(r.content), r.created_at, r.retracted_at)
        for r in got
    ]
