"""Feedback on a job's output (`POST /api/ai/jobs/{jobId}/feedback`): one score per job from its
owner, stored with what the job ran on (its rollout arm, prompt version, answering model) so a
rollout's figures and guard can judge its arms (jobs/rollouts.py).

Only the job's owner may give it (anyone else, admins included, reads JOB_NOT_FOUND, the same
answer as for a job that does not exist), only once it succeeded (JOB_NOT_SUCCEEDED); a second
feedback replaces the first. `itemOrdinal`, when given, must be one of the job's artifacts'. The
comment is the job's private data: the job's purge and retention clear it (db/retention.py), and
a job already purged keeps no comment.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

from db import feedback as feedback_db
from db import jobs as jobs_db
from db.feedback import FeedbackRow
from db.session import SessionMaker
from engine.errors import JobNotSucceeded, ValidationFailed
from engine.lifecycle import LifecycleStatus
from jobs.views import Owner, can_see, not_found


async def give(
    sm: SessionMaker,
    job_id: uuid.UUID,
    user_id: str,
    *,
    score: Decimal,
    item_ordinal: int | None = None,
    comment: str | None = None,
) -> FeedbackRow:
    """Store (or replace) `user_id`'s feedback of the job in one transaction, the job's row
    locked so its purge cannot pass between the check and the write."""
    async with sm.begin() as s:
        row = await jobs_db.get_for_update(s, job_id)
        if row is None or not can_see(Owner(user_id), row.user_id):
            raise not_found()
        if row.lifecycle_status != LifecycleStatus.SUCCEEDED:
            raise JobNotSucceeded(
                f"The job is {row.lifecycle_status}: only a succeeded job can be given feedback."
            )
        if item_ordinal is not None and not await feedback_db.has_artifact(s, job_id, item_ordinal):
            msg = "itemOrdinal must be the ordinal of one of the job's artifacts"
            raise ValidationFailed(
                msg, errors=[{"loc": ["body", "itemOrdinal"], "msg": msg, "type": "value"}]
            )
        if row.private_data_purged_at is not None:
            comment = None  # purged private data is not collected again
        stored = await feedback_db.upsert(
            s, job_id, user_id, score=score, item_ordinal=item_ordinal, comment=comment
        )
    if stored is None:
        raise not_found()
    return stored
