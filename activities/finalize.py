"""The endings of the other outcomes (local activities): `finalize_failed` after Temporal gave
up on a job, `finalize_cancelled` after a cancel. Each writes the job's one terminal state and
its domain event in one transaction; the workflow shields both from a second cancel, so every
job reaches exactly one terminal state."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from temporalio import activity

from activities.deps import StageDeps, lock_owner
from db.outbox import CANCELLED, FAILED
from engine.contracts import (
    FINALIZE_CANCELLED,
    FINALIZE_FAILED,
    FinalizeFailedInput,
    FinalizeResult,
    StageInput,
)
from engine.errors import IllegalTransition, JobNotFound, LockConflict, public_message_for
from engine.lifecycle import LifecycleStatus


class Finalize:
    def __init__(self, deps: StageDeps) -> None:
        self._d = deps

    @activity.defn(name=FINALIZE_FAILED)
    async def finalize_failed(self, inp: FinalizeFailedInput) -> FinalizeResult:
        """The job's one `failed`, after Temporal gave up on it. A cancel the user asked for
        wins over a failure that followed it (a worker lost during a cancel ends `cancelled`).
        A job that never got as far as `running` (its first EXECUTE transaction never committed)
        is taken through `running` to `failed` in one transaction, so it cannot stay queued
        behind a closed workflow."""
        d = self._d
        job_id = uuid.UUID(inp.job_id)
        try:
            async with d.sessionmaker.begin() as s:
                row = await d.jobs.get(s, job_id)
                if row is None:
                    return FinalizeResult("failed")  # the row is gone; the execution failed
                if row.cancel_requested_at is not None and row.lifecycle_status in (
                    LifecycleStatus.QUEUED,
                    LifecycleStatus.RUNNING,
                ):
                    await d.lifecycle.mark_cancelled(s, job_id)
                    await self._event(s, CANCELLED, inp.job_id, {"jobId": inp.job_id})
                    ended, code = "cancelled", "CANCELLED"
                else:
                    if row.lifecycle_status == LifecycleStatus.QUEUED:
                        await d.lifecycle.lock(
                            s,
                            job_id,
                            owner=lock_owner(),
                            identity=d.config.identity,
                            # Taken and ended in this transaction: any TTL does.
                            ttl_s=d.config.lock_ttl_s or 60,
                        )
                    await d.lifecycle.mark_failed(
                        s, job_id, inp.code, public_message_for(inp.code), None
                    )
                    await self._event(
                        s,
                        FAILED,
                        inp.job_id,
                        {"jobId": inp.job_id, "jobType": row.job_type, "errorCode": inp.code},
                    )
                    ended, code = "failed", inp.code
            # Counted after the commit: a retried attempt finds the job ended and counts nothing.
            d.metrics.job_finished(row.job_type, ended, code)
            return FinalizeResult(ended)
        except (IllegalTransition, LockConflict):
            async with d.sessionmaker.begin() as s:
                current = await d.jobs.get(s, job_id)
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
                await d.lifecycle.mark_cancelled(s, job_id)
                await self._event(s, CANCELLED, inp.job_id, {"jobId": inp.job_id})
            job_type = activity.info().workflow_type or ""  # a job workflow is named after its type
            d.metrics.job_finished(job_type, "cancelled", "CANCELLED")
            return FinalizeResult("cancelled")
        except IllegalTransition as exc:
            return FinalizeResult(str(exc.from_status))
        except JobNotFound:
            return FinalizeResult("cancelled")  # the job row is gone: nothing left to mark

    async def _event(
        self, s: AsyncSession, event_type: str, job_id: str, payload: dict[str, Any]
    ) -> None:
        """The domain event of a job's end, in the transaction that ends it."""
        await self._d.outbox.insert(
            s,
            event_type=event_type,
            aggregate_type="AiJob",
            aggregate_id=job_id,
            dedupe_key=f"{event_type}:{job_id}",
            payload=payload,
            notify=False,
        )
