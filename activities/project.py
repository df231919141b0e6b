"""PROJECT (a local activity): the stored output becomes the job type's business rows, its
artifacts, `succeeded` and `ai.job.completed`, in one transaction. `project_output` is that
transaction's body; runs recorded before the five-stage shape also call it inside EXECUTE's
last transaction (`ExecuteInput.project_in_slot`)."""

from __future__ import annotations

import uuid

from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.deps import StageDeps, lock_owner, log
from activities.failures import (
    fail_attempt,
    fail_domain,
    fail_final,
    internal_message,
    loggable,
    private_strings,
)
from db import artifacts as artifacts_db
from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db.errors import is_unavailable
from db.jobs import JobRow
from db.pipeline import Statement
from db.usage import SUMMARY, summary_of
from engine.contracts import PROJECT, ProjectInput, ProjectResult
from engine.errors import EngineError, IllegalTransition, LockConflict
from engine.lifecycle import LifecycleStatus
from jobs import lifecycle


class Project:
    def __init__(self, deps: StageDeps) -> None:
        self._d = deps

    @activity.defn(name=PROJECT)
    async def project(self, inp: ProjectInput) -> ProjectResult:
        """Projector + markSucceeded + `ai.job.completed` + progress 100 in one transaction.
        Idempotent: a retry after a commit whose result was lost finds `succeeded` and its
        artifacts; unique keys make a repeated projection write nothing new."""
        d = self._d
        job_id = uuid.UUID(inp.job_id)
        attempt = activity.info().attempt
        row: JobRow | None = None
        try:
            async with d.sessionmaker.begin() as s:
                row = await jobs_db.get(s, job_id)
                if row is None:
                    fail_final("INTERNAL_JOB_MISSING")
                if row.lifecycle_status != LifecycleStatus.RUNNING:
                    arts = await artifacts_db.artifacts(s, [job_id])
                    return ProjectResult(row.lifecycle_status, len(arts[job_id]))
                if row.output is None or row.output_hash != inp.output_hash:
                    fail_final("INTERNAL_OUTPUT_MISMATCH")
                jt = d.catalog.get(row.job_type)
                out = jt.output_model.model_validate(row.output)
                result = await project_output(d, s, row, out, inp.output_hash, lock_owner())
            d.metrics.job_finished(row.job_type, "succeeded")
            log_completed(inp.job_id, result)
            return result
        except ApplicationError:
            raise
        except (IllegalTransition, LockConflict):
            # A concurrent PROJECT (or a cancel) won the row: report what the job is now.
            async with d.sessionmaker.begin() as s:
                row = await jobs_db.get(s, job_id)
                arts = await artifacts_db.artifacts(s, [job_id])
            if row is None:
                fail_final("INTERNAL_JOB_MISSING")
            return ProjectResult(row.lifecycle_status, len(arts[job_id]))
        except EngineError as exc:
            fail_domain(exc)
        except Exception as exc:
            if is_unavailable(exc):
                raise  # retried by the bookkeeping policy until the database is back
            log.warning(
                "projection failed",
                extra={"job_id": inp.job_id, "attempt": attempt},
                exc_info=loggable(exc),
            )
            private = private_strings(row.input, row.output) if row is not None else []
            await self._note_internal(
                job_id, internal_message(exc, private=private, context="projection failed")
            )
            fail_attempt("INTERNAL_PROJECTION_FAILED", attempt=attempt)

    async def _note_internal(self, job_id: uuid.UUID, message: str) -> None:
        try:
            async with self._d.sessionmaker.begin() as s:
                await lifecycle_db.record_attempt(
                    s, job_id, attempt=0, internal_error=message[:2000]
                )
        except Exception:
            log.warning("could not record internal error", extra={"job_id": str(job_id)})


async def project_output(
    d: StageDeps, s: AsyncSession, row: JobRow, out: BaseModel, digest: str, owner: str
) -> ProjectResult:
    """Projector + artifacts + `jobs/lifecycle.py` `succeed_statements` (`succeeded` with its
    `ai.job.completed`) + the usage summary, in the caller's transaction. Idempotent through
    unique keys (a repeated projection of the same output writes nothing new); raises what the
    projector raises."""

    # The artifacts, `succeeded` with its `ai.job.completed`, and the usage summary: the same
    # statements in the same order as one by one, pipelined in this transaction (one round
    # trip, db/pipeline.py).
    def tail(count: int) -> list[Statement]:
        succeeded = lifecycle.succeed_statements(
            row.id, job_type=row.job_type, owner=owner, output_hash=digest, artifact_count=count
        )
        return [*succeeded, (SUMMARY, {"id": row.id})]

    jt = d.catalog.get(row.job_type)
    count, (cas, _event, summary) = await lifecycle.project_artifacts(
        s, jt, row, out, digest, tail=tail
    )
    if not cas:  # the CAS running -> succeeded matched no row
        await lifecycle.succeed_missed(s, row.id, owner=owner)
    usage = summary_of(summary[0])
    return ProjectResult(
        LifecycleStatus.SUCCEEDED.value,
        count,
        calls=usage.calls,
        tokens_in=usage.tokens_in,
        tokens_out=usage.tokens_out,
        cost_micros=int(usage.cost_usd * 1_000_000),
        summarized=True,
    )


def log_completed(job_id: str, result: ProjectResult) -> None:
    """The job's one "completed" line, after the commit that made it so."""
    log.info(
        "job completed",
        extra={
            "job_id": job_id,
            "calls": result.calls,
            "tokens_in": result.tokens_in,
            "tokens_out": result.tokens_out,
            "cost_micros": result.cost_micros,
        },
    )
