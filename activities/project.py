"""PROJECT (a local activity): the stage of a job's success ending. The ending itself (the
stored output checked, projected into the job type's business rows and artifacts, `succeeded`
with `ai.job.completed`, the usage summed, in one transaction) is `jobs/lifecycle.py`
`succeed`; this adapter decodes the input, maps the outcome to the workflow's result and its
failures to Temporal's, counts and logs."""

from __future__ import annotations

import uuid

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
from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db.errors import is_unavailable
from engine.contracts import PROJECT, ProjectInput, ProjectResult
from engine.errors import EngineError, IllegalTransition, LockConflict
from jobs import lifecycle


class Project:
    def __init__(self, deps: StageDeps) -> None:
        self._d = deps

    @activity.defn(name=PROJECT)
    async def project(self, inp: ProjectInput) -> ProjectResult:
        """The job's success ending (`jobs/lifecycle.py` `succeed`), counted and logged after
        its commit. Idempotent: a retry after a commit whose result was lost finds `succeeded`
        and its artifacts; unique keys make a repeated projection write nothing new."""
        d = self._d
        job_id = uuid.UUID(inp.job_id)
        attempt = activity.info().attempt
        try:
            success = await lifecycle.succeed(
                d.sessionmaker, d.catalog, job_id, output_hash=inp.output_hash, owner=lock_owner()
            )
        except ApplicationError:
            raise
        except (IllegalTransition, LockConflict):
            # A concurrent PROJECT (or a cancel) won the row: report what the job is now.
            found = await lifecycle.outcome(d.sessionmaker, job_id)
            if found is None:
                fail_final("INTERNAL_JOB_MISSING")
            return result_of(found)
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
            await self._note_internal(job_id, exc)
            fail_attempt("INTERNAL_PROJECTION_FAILED", attempt=attempt)
        if success.usage is not None:  # this call ended the job
            d.metrics.job_finished(success.job_type, "succeeded")
            result = result_of(success)
            log_completed(inp.job_id, result)
            return result
        return result_of(success)

    async def _note_internal(self, job_id: uuid.UUID, exc: Exception) -> None:
        """The projection's unexpected failure, for operators, without the job's own strings
        (its input and output, read again: the failed transaction wrote nothing)."""
        try:
            async with self._d.sessionmaker.begin() as s:
                row = await jobs_db.get(s, job_id)
                private = private_strings(row.input, row.output) if row is not None else []
                message = internal_message(exc, private=private, context="projection failed")
                await lifecycle_db.record_attempt(
                    s, job_id, attempt=0, internal_error=message[:2000]
                )
        except Exception:
            log.warning("could not record internal error", extra={"job_id": str(job_id)})


def result_of(success: lifecycle.Success) -> ProjectResult:
    """The workflow's view of a success ending: with the usage summed in its transaction when
    this call ended the job (COMPLETE reports it), without it otherwise (COMPLETE reads it)."""
    usage = success.usage
    if usage is None:
        return ProjectResult(success.status, success.artifact_count)
    return ProjectResult(
        success.status,
        success.artifact_count,
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
