"""The endings of the other outcomes (local activities): `finalize_failed` after Temporal gave
up on a job, `finalize_cancelled` after a cancel. Each ends the job through `jobs/lifecycle.py`
(its one terminal state and its domain event, in one transaction); the workflow shields both
from a second cancel, so every job reaches exactly one terminal state."""

from __future__ import annotations

import uuid

from temporalio import activity

from activities.deps import StageDeps, lock_owner
from db import jobs as jobs_db
from engine.contracts import (
    FINALIZE_CANCELLED,
    FINALIZE_FAILED,
    FinalizeFailedInput,
    FinalizeResult,
    StageInput,
)
from engine.errors import IllegalTransition, JobNotFound, LockConflict
from jobs import lifecycle


class Finalize:
    def __init__(self, deps: StageDeps) -> None:
        self._d = deps

    @activity.defn(name=FINALIZE_FAILED)
    async def finalize_failed(self, inp: FinalizeFailedInput) -> FinalizeResult:
        """The job's one `failed`, after Temporal gave up on it, by the rules of
        `jobs/lifecycle.py` `finalize_failed`: a cancel the user asked for wins (the job ends
        `cancelled`), and a job that never got as far as `running` is taken through it, so it
        cannot stay queued behind a closed workflow."""
        d = self._d
        job_id = uuid.UUID(inp.job_id)
        try:
            async with d.sessionmaker.begin() as s:
                # A long-source job keeps its succeeded chunks' items in this transaction.
                ending = await lifecycle.finalize_failed(
                    s,
                    job_id,
                    code=inp.code,
                    owner=lock_owner(),
                    identity=d.config.identity,
                    catalog=d.catalog,
                )
            if ending is None:
                return FinalizeResult("failed")  # the row is gone; the execution failed
            # Counted after the commit: a retried attempt finds the job ended and counts nothing.
            d.metrics.job_finished(ending.job_type, ending.status.value, ending.code)
            return FinalizeResult(ending.status.value)
        except (IllegalTransition, LockConflict):
            async with d.sessionmaker.begin() as s:
                current = await jobs_db.get(s, job_id)
            return FinalizeResult(current.lifecycle_status if current else "failed")
        except JobNotFound:
            return FinalizeResult("failed")

    @activity.defn(name=FINALIZE_CANCELLED)
    async def finalize_cancelled(self, inp: StageInput) -> FinalizeResult:
        """The job's one `cancelled`; a job that ended first (a finish won the race) reports
        the state it reached."""
        d = self._d
        job_id = uuid.UUID(inp.job_id)
        try:
            async with d.sessionmaker.begin() as s:
                # A long-source job keeps its succeeded chunks' items in this transaction.
                await lifecycle.cancel(s, job_id, catalog=d.catalog)
            job_type = activity.info().workflow_type or ""  # a job workflow is named after its type
            d.metrics.job_finished(job_type, "cancelled", "CANCELLED")
            return FinalizeResult("cancelled")
        except IllegalTransition as exc:
            return FinalizeResult(str(exc.from_status))
        except JobNotFound:
            return FinalizeResult("cancelled")  # the job row is gone: nothing left to mark
