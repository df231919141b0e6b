"""Result reuse's reads and its one write (jobs/reuse.py is the use case): a create's lookup of
the user's source job by reuse key, the `reuse` stage's read of a job and its source, the
source forgotten when it ended without an answer, and the queued jobs that wait on a source
(the reuse waker's, runtime/reuse_waker.py).

Every lookup is by user first (`user_id = :u`, the index `ix_ai_job_user_reuse_key` leads with
it): a job never reuses another user's answer. Every function runs in the caller's transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.lifecycle import TERMINAL_SQL


@dataclass(frozen=True)
class Candidate:
    """The newest of the user's jobs with a key that can still give an answer: its id, its
    state and the source it waits on itself (None: it is a root)."""

    id: uuid.UUID
    lifecycle_status: str
    reused_from_job_id: uuid.UUID | None


# The user's newest job with the key that succeeded with its answer still held (not purged),
# or that is still queued or running with no cancel asked for (for a reuser that is not
# `:patient`, only a standard one that is due: never a batch, off-peak or delayed one, whose
# answer may be hours away); none of `:x`, and no active job that waits on one of `:x`.
_CANDIDATE = text(
    """
    SELECT id, lifecycle_status, reused_from_job_id FROM ai_job
    WHERE user_id = :u AND job_type = :t AND reuse_key = :k AND id <> ALL(CAST(:x AS uuid[]))
      AND ((lifecycle_status = 'succeeded' AND output IS NOT NULL
            AND output_hash IS NOT NULL AND private_data_purged_at IS NULL)
           OR (lifecycle_status IN ('queued', 'running') AND cancel_requested_at IS NULL
               AND (CAST(:patient AS boolean)
                    OR (service_tier = 'standard' AND (run_at IS NULL OR run_at <= now())))
               AND (reused_from_job_id IS NULL
                    OR reused_from_job_id <> ALL(CAST(:x AS uuid[])))))
    ORDER BY created_at DESC, id DESC
    LIMIT 1
    """
)


async def candidate(
    s: AsyncSession,
    *,
    user_id: str,
    job_type: str,
    reuse_key: str,
    excluding: Sequence[uuid.UUID] = (),
    patient: bool = False,
) -> Candidate | None:
    """The user's newest job with `reuse_key` that succeeded (answer held) or is still active,
    leaving out the jobs `excluding` and the active jobs that wait on one of them; None: none.
    An active one is a candidate for a `patient` reuser (one of a slower tier itself) only, or
    when it is a standard job that is due. Read under the user's create lock (jobs/reuse.py), so
    two identical creates see each other."""
    params = {"u": user_id, "t": job_type, "k": reuse_key, "x": list(excluding), "patient": patient}
    row = (await s.execute(_CANDIDATE, params)).first()
    return Candidate(row.id, row.lifecycle_status, row.reused_from_job_id) if row else None


@dataclass(frozen=True)
class JobReuse:
    """The `reuse` stage's view of a job: its state, lock, stored answer and the source it
    reuses (None: none, or forgotten)."""

    id: uuid.UUID
    user_id: str
    job_type: str
    reuse_key: str | None
    lifecycle_status: str
    locked_by: str | None
    output_hash: str | None
    reused_from_job_id: uuid.UUID | None
    service_tier: str = "standard"


@dataclass(frozen=True)
class SourceAnswer:
    """A source job as the `reuse` stage reads it: its state, whether it is still held by its
    user's dispatch window (queued, its workflow not started: db/relay.py) and, when it
    succeeded and its private data is kept, its stored answer and hash (None otherwise)."""

    lifecycle_status: str
    held: bool
    output: dict[str, Any] | None
    output_hash: str | None
    flagged_items: int | None = None  # what moderation dropped from it (its copies say so too)


async def job(s: AsyncSession, job_id: uuid.UUID) -> JobReuse | None:
    """The job's reuse state, its row locked (`FOR UPDATE`) until the transaction ends."""
    row = (
        await s.execute(
            text(
                "SELECT id, user_id, job_type, reuse_key, lifecycle_status, locked_by, "
                "output_hash, reused_from_job_id, service_tier FROM ai_job "
                "WHERE id = :id FOR UPDATE"
            ),
            {"id": job_id},
        )
    ).first()
    return JobReuse(**row._mapping) if row else None


async def source(
    s: AsyncSession, source_id: uuid.UUID, *, user_id: str, share: bool = True
) -> SourceAnswer | None:
    """The source job (the same user's only), read `FOR SHARE` (`share`): a purge cannot take
    its answer away while it is copied. None: gone, or not the user's."""
    row = (
        await s.execute(
            text(
                """
                SELECT lifecycle_status,
                       (lifecycle_status = 'queued' AND dispatched_at IS NULL) AS held,
                       CASE WHEN private_data_purged_at IS NULL THEN output END AS output,
                       CASE WHEN private_data_purged_at IS NULL THEN output_hash END
                           AS output_hash,
                       flagged_items
                FROM ai_job WHERE id = :id AND user_id = :u
                """
                + (" FOR SHARE" if share else "")
            ),
            {"id": source_id, "u": user_id},
        )
    ).first()
    return SourceAnswer(**row._mapping) if row else None


async def set_source(s: AsyncSession, job_id: uuid.UUID, source_id: uuid.UUID | None) -> bool:
    """The queued job's source: another one (its own ended without an answer to give), or none
    (it makes its own call). False: the job is no longer queued."""
    result = await s.execute(
        text(
            "UPDATE ai_job SET reused_from_job_id = :src, updated_at = now() "
            "WHERE id = :id AND lifecycle_status = 'queued'"
        ),
        {"id": job_id, "src": source_id},
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def waiting_on(s: AsyncSession, source_id: uuid.UUID) -> list[str]:
    """The workflow ids of the queued jobs that reuse `source_id`."""
    rows = await s.execute(
        text(
            "SELECT workflow_id FROM ai_job "
            "WHERE reused_from_job_id = :id AND lifecycle_status = 'queued'"
        ),
        {"id": source_id},
    )
    return [r.workflow_id for r in rows]


async def waiting_on_ended(s: AsyncSession) -> list[str]:
    """The workflow ids of every queued job whose source has ended (the waker's sweep after it
    (re)connected: notifications sent while it was away are lost)."""
    rows = await s.execute(
        text(
            f"""
            SELECT d.workflow_id FROM ai_job d JOIN ai_job src ON src.id = d.reused_from_job_id
            WHERE d.reused_from_job_id IS NOT NULL AND d.lifecycle_status = 'queued'
              AND src.{TERMINAL_SQL}
            """
        )
    )
    return [r.workflow_id for r in rows]
