"""A job's artifacts: the pages a job's output is published as, read by owners and admins and
written by the stages. Every function runs in the caller's session and never commits."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession


@dataclass(frozen=True)
class ArtifactRef:
    artifact_type: str
    artifact_id: str
    ordinal: int


async def artifacts(
    session: AsyncSession, job_ids: list[uuid.UUID]
) -> dict[uuid.UUID, list[ArtifactRef]]:
    out: dict[uuid.UUID, list[ArtifactRef]] = {j: [] for j in job_ids}
    if not job_ids:
        return out
    rows = await session.execute(
        text(
            "SELECT job_id, artifact_type, artifact_id, ordinal FROM ai_job_artifact "
            "WHERE job_id = ANY(:ids) ORDER BY job_id, ordinal, id"
        ),
        {"ids": job_ids},
    )
    for r in rows:
        out[r.job_id].append(ArtifactRef(r.artifact_type, r.artifact_id, r.ordinal))
    return out


async def artifact_page(
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    after: tuple[int, int] | None,
    limit: int,
) -> list[tuple[int, ArtifactRef]]:
    """One page of a job's artifacts in (ordinal, id) order, after the keyset `after`;
    each with its row id (the keyset of the next page)."""
    rows = await session.execute(
        text(
            """
            SELECT id, artifact_type, artifact_id, ordinal FROM ai_job_artifact
            WHERE job_id = :j
              AND (CAST(:ao AS integer) IS NULL OR (ordinal, id) > (:ao, CAST(:ai AS bigint)))
            ORDER BY ordinal, id LIMIT :lim
            """
        ),
        {
            "j": job_id,
            "ao": after[0] if after else None,
            "ai": after[1] if after else None,
            "lim": limit,
        },
    )
    return [(r.id, ArtifactRef(r.artifact_type, r.artifact_id, r.ordinal)) for r in rows]


# A projection's artifact, idempotent on (job_id, artifact_type, artifact_id): a repeated one
# writes nothing. PROJECT pipelines it with its ending (db/endings.py `artifact_statements`).
INSERT_ARTIFACT = text(
    """
    INSERT INTO ai_job_artifact (job_id, artifact_type, artifact_id, ordinal, created_at)
    VALUES (:j, :t, :a, :o, now())
    ON CONFLICT (job_id, artifact_type, artifact_id) DO NOTHING
    RETURNING id
    """
)


def artifact_params(
    job_id: uuid.UUID, artifact_type: str, artifact_id: str, ordinal: int
) -> dict[str, Any]:
    return {"j": job_id, "t": artifact_type, "a": artifact_id, "o": ordinal}
