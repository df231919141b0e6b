"""The owner's purge of one job's private data (`DELETE /api/ai/jobs/{jobId}`): what retention
does after DATA_RETENTION_DAYS, done now, for one job, by the same statement
(`db/retention.py` `purge_jobs`).

Only a job that has ended may be purged (a queued or running job still needs its input:
409 `JOB_NOT_TERMINAL`); someone else's job reads as missing (404, the one owner rule of
jobs/views.py, without the admin exception: the purge is the owner's own decision). A second
purge finds nothing left and succeeds (idempotent). The lifecycle row and its usage rows stay,
for billing and audit, and the job's views say `privateDataPurged: true`.
"""

from __future__ import annotations

import logging
import uuid

from db import jobs as jobs_db
from db import retention as retention_db
from db.session import SessionMaker
from engine.errors import JobNotTerminal
from engine.lifecycle import TERMINAL_VALUES
from jobs.views import Owner, can_see, not_found

log = logging.getLogger(__name__)


async def purge_own_job(sm: SessionMaker, job_id: uuid.UUID, user_id: str) -> bool:
    """Purge the job's private data in one transaction, the row locked (`FOR UPDATE`) so an
    ending cannot race the check; True when this call purged it, False when it already was."""
    async with sm.begin() as s:
        row = await jobs_db.get_for_update(s, job_id)
        if row is None or not can_see(Owner(user_id), row.user_id):
            raise not_found()
        if row.lifecycle_status not in TERMINAL_VALUES:
            raise JobNotTerminal(
                f"The job is {row.lifecycle_status}: only a job that has ended can be purged; "
                "cancel it first (POST /api/ai/jobs/{jobId}/cancel)."
            )
        purged = await retention_db.purge_jobs(s, [job_id]) == 1
    if purged:
        log.info(
            "job private data purged by its owner",
            extra={"job_id": str(job_id), "job_type": row.job_type},
        )
    return purged
