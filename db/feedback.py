"""`ai_job_feedback`: one owner's score of one succeeded job (jobs/feedback.py), written with
what the job ran on (its rollout arm, prompt version and the model that answered), so a rollout's
figures and its guard read feedback without a join. Writing a feedback of a rollout's job runs
the guard in the same transaction (migration 0038's trigger). Every function runs in the
caller's transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.jobs import ANSWERING_CALL


@dataclass(frozen=True)
class FeedbackRow:
    job_id: uuid.UUID
    user_id: str
    score: Decimal
    item_ordinal: int | None
    comment: str | None
    rollout_arm: str | None
    prompt_version: str
    model: str | None
    created_at: datetime
    updated_at: datetime
    created: bool  # the first for this job and user (else it replaced the earlier one)


# The job's arm, prompt version and answering model are copied from the job in the statement;
# `xmax = 0` tells an insert from an update of the row the conflict found.
_UPSERT = text(
    f"""
    INSERT INTO ai_job_feedback AS f (job_id, user_id, score, item_ordinal, comment,
        rollout_id, rollout_arm, prompt_version, model)
    SELECT j.id, :user_id, :score, :ordinal, :comment, j.rollout_id, j.rollout_arm,
           j.prompt_version, (SELECT c.model FROM ({ANSWERING_CALL}) c)
    FROM ai_job j WHERE j.id = :job_id
    ON CONFLICT (job_id, user_id) DO UPDATE SET score = EXCLUDED.score,
        item_ordinal = EXCLUDED.item_ordinal, comment = EXCLUDED.comment, updated_at = now()
    RETURNING f.job_id, f.user_id, f.score, f.item_ordinal, f.comment, f.rollout_arm,
        f.prompt_version, f.model, f.created_at, f.updated_at, (f.xmax = 0) AS created
    """
)
_HAS_ARTIFACT = text(
    "SELECT EXISTS (SELECT 1 FROM ai_job_artifact WHERE job_id = :job_id AND ordinal = :n)"
)


async def upsert(
    s: AsyncSession,
    job_id: uuid.UUID,
    user_id: str,
    *,
    score: Decimal,
    item_ordinal: int | None,
    comment: str | None,
) -> FeedbackRow | None:
    """The user's feedback of the job, written or replaced (None: no such job)."""
    params = {
        "job_id": job_id,
        "user_id": user_id,
        "score": score,
        "ordinal": item_ordinal,
        "comment": comment,
    }
    row = (await s.execute(_UPSERT, params)).first()
    return None if row is None else FeedbackRow(**row._mapping)


async def has_artifact(s: AsyncSession, job_id: uuid.UUID, ordinal: int) -> bool:
    """Whether the job has an artifact at `ordinal`."""
    return bool((await s.execute(_HAS_ARTIFACT, {"job_id": job_id, "n": ordinal})).scalar())
