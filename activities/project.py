"""PROJECT (a local activity): the stored output becomes the job type's business rows, its
artifacts, `succeeded` and `ai.job.completed`, in one transaction. A job type with a planned
projector (the usual case) takes three round trips on the pooled connection
(`project_planned`); a session projector runs in `project_output`, which runs recorded before
the five-stage shape also call inside EXECUTE's last transaction
(`ExecuteInput.project_in_slot`)."""

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
from db import pipeline
from db.errors import is_unavailable
from db.jobs import JobRow
from db.pipeline import Row, Statement
from db.usage import SUMMARY, summary_of
from engine.contracts import PROJECT, ProjectInput, ProjectResult
from engine.errors import EngineError, IllegalTransition, LockConflict
from engine.lifecycle import LifecycleStatus
from jobs import lifecycle
from jobs.spec import AnyJobType


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
            result: ProjectResult | None = None
            # The usual case in three round trips on the pooled connection: BEGIN with the read,
            # the planned writes with the engine's own, COMMIT.
            async with pipeline.transaction(d.sessionmaker) as tx:
                [found] = await tx.run([(jobs_db.GET, {"id": job_id})])
                row = jobs_db.row_of(found)
                if row is None:
                    fail_final("INTERNAL_JOB_MISSING")
                jt = d.catalog.get(row.job_type)
                planned = jt.project is None and row.lifecycle_status == LifecycleStatus.RUNNING
                if planned:
                    out = self._validated(jt, row, inp.output_hash)
                    result = await project_planned(tx, jt, row, out, inp.output_hash, lock_owner())
            if planned and result is None:  # the CAS running -> succeeded matched no row
                async with d.sessionmaker.begin() as s:
                    await lifecycle.succeed_missed(s, job_id, owner=lock_owner())
            if not planned:  # a session projector, or the job is no longer running
                async with d.sessionmaker.begin() as s:
                    row = await jobs_db.get(s, job_id)
                    if row is None:
                        fail_final("INTERNAL_JOB_MISSING")
                    if row.lifecycle_status != LifecycleStatus.RUNNING:
                        arts = await artifacts_db.artifacts(s, [job_id])
                        return ProjectResult(row.lifecycle_status, len(arts[job_id]))
                    jt = d.catalog.get(row.job_type)
                    out = self._validated(jt, row, inp.output_hash)
                    result = await project_output(d, s, row, out, inp.output_hash, lock_owner())
            assert result is not None
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

    @staticmethod
    def _validated(jt: AnyJobType, row: JobRow, digest: str) -> BaseModel:
        """The stored output, as the job type's model; it must be the one EXECUTE stored."""
        if row.output is None or row.output_hash != digest:
            fail_final("INTERNAL_OUTPUT_MISMATCH")
        out: BaseModel = jt.output_model.model_validate(row.output)
        return out

    async def _note_internal(self, job_id: uuid.UUID, message: str) -> None:
        try:
            async with self._d.sessionmaker.begin() as s:
                await lifecycle_db.record_attempt(
                    s, job_id, attempt=0, internal_error=message[:2000]
                )
        except Exception:
            log.warning("could not record internal error", extra={"job_id": str(job_id)})


def _tail(row: JobRow, digest: str, owner: str, count: int) -> list[Statement]:
    """After the artifacts: `succeeded` with its `ai.job.completed` (jobs/lifecycle.py
    `succeed_statements`), then the usage summary."""
    succeeded = lifecycle.succeed_statements(
        row.id, job_type=row.job_type, owner=owner, output_hash=digest, artifact_count=count
    )
    return [*succeeded, (SUMMARY, {"id": row.id})]


def _succeeded(count: int, summary: list[Row]) -> ProjectResult:
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


async def project_planned(
    tx: pipeline.Transaction,
    jt: AnyJobType,
    row: JobRow,
    out: BaseModel,
    digest: str,
    owner: str,
) -> ProjectResult | None:
    """A planned projector's writes, the artifacts, `succeeded` with its event and the usage
    summary, in one round trip in `tx`, then its COMMIT. None, and nothing committed, when the
    CAS running -> succeeded matched no row (the caller asks `succeed_missed` why)."""
    statements, count = lifecycle.planned_statements(jt, row, out, digest)
    results = await tx.run([*statements, *_tail(row, digest, owner, count)])
    cas, _event, summary = results[len(statements) :]
    if not cas:
        return None  # rolled back when the transaction's block ends
    await tx.commit()
    return _succeeded(count, summary)


async def project_output(
    d: StageDeps, s: AsyncSession, row: JobRow, out: BaseModel, digest: str, owner: str
) -> ProjectResult:
    """Projector + artifacts + `jobs/lifecycle.py` `succeed_statements` (`succeeded` with its
    `ai.job.completed`) + the usage summary, in the caller's transaction. Idempotent through
    unique keys (a repeated projection of the same output writes nothing new); raises what the
    projector raises."""
    # The same statements in the same order as one by one, pipelined in this transaction
    # after a session projector's own writes (one round trip, db/pipeline.py).
    jt = d.catalog.get(row.job_type)
    count, (cas, _event, summary) = await lifecycle.project_artifacts(
        s, jt, row, out, digest, tail=lambda n: _tail(row, digest, owner, n)
    )
    if not cas:  # the CAS running -> succeeded matched no row
        await lifecycle.succeed_missed(s, row.id, owner=owner)
    return _succeeded(count, summary)


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
