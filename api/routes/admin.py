"""SUPER_ADMIN routes: list/filter any job, see internals (and why it is stuck), cancel any job,
retry failed or cancelled jobs. Each is recorded in the admin audit log (jobs/audit.py): the
actions in their own transaction, the views of internals and the refusals afterwards."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BeforeValidator
from sqlalchemy.ext.asyncio import AsyncSession

from api.deps import Admin, State
from api.schemas import (
    JOB_TYPE_PATTERN,
    NO_NUL,
    AdminJobDetailResponse,
    AdminJobPage,
    AdminJobResponse,
    CancelResponse,
    JobStatusResponse,
    Queue,
    Status,
    StuckOut,
    decode_cursor,
    encode_cursor,
    status_response,
)
from api.stuck import stuck_for
from db.jobs import ArtifactRef, JobFilter, JobQueries, JobRow
from engine.errors import JobNotFound
from jobs.audit import JOB_CANCEL, JOB_LIST, JOB_RETRY, JOB_VIEW, AuditEntry, AuditLog

router = APIRouter(prefix="/admin-api/ai/jobs", tags=["admin"])
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


def iso_datetime(value: Any) -> Any:
    """An RFC 3339 date-time, as documented: not a bare number (read as a Unix time)."""
    if isinstance(value, str) and not _ISO_DATE.match(value):
        raise ValueError("must be an RFC 3339 date-time")
    return value


_jobs = JobQueries()


def admin_json(state: State, row: JobRow, arts: list[ArtifactRef]) -> dict[str, Any]:
    ui = state.settings.temporal_ui_url.rstrip("/")
    ns = quote(state.settings.temporal_namespace, safe="")
    data = status_response(row, arts)
    data.update(
        user_id=row.user_id,
        target_type=row.target_type,
        target_id=row.target_id,
        internal_error_message=row.internal_error_message,
        workflow_id=row.workflow_id,
        temporal_ui_url=f"{ui}/namespaces/{ns}/workflows/{quote(row.workflow_id, safe='')}",
        attempt_count=row.attempt_count,
        cancel_requested_at=row.cancel_requested_at,
        retried_from_job_id=row.retried_from_job_id,
        output_hash=row.output_hash,
    )
    return AdminJobResponse(**data).model_dump(mode="json", by_alias=True)


@router.get("", response_model=AdminJobPage, summary="List and filter all jobs")
async def list_jobs(
    state: State,
    admin: Admin,
    job_type: Annotated[
        str | None, Query(alias="jobType", max_length=64, pattern=JOB_TYPE_PATTERN)
    ] = None,
    status_: Annotated[Status | None, Query(alias="status")] = None,
    queue_name: Annotated[Queue | None, Query(alias="queueName")] = None,
    user_id: Annotated[str | None, Query(alias="userId", max_length=128, pattern=NO_NUL)] = None,
    created_from: Annotated[
        datetime | None, BeforeValidator(iso_datetime), Query(alias="createdFrom")
    ] = None,
    created_to: Annotated[
        datetime | None, BeforeValidator(iso_datetime), Query(alias="createdTo")
    ] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    f = JobFilter(
        user_id=user_id,
        job_type=job_type,
        status=status_,
        queue_name=queue_name,
        created_from=created_from,
        created_to=created_to,
    )
    after = decode_cursor(cursor)
    async with state.sessionmaker() as s:
        rows = await _jobs.list_jobs(s, f, after=after, limit=limit + 1)
        page = rows[:limit]
        arts = await _jobs.artifacts(s, [r.id for r in page])
    # The page shows every listed job's internalErrorMessage: a view of internals.
    await AuditLog(state.sessionmaker).record(
        AuditEntry(admin.user_id, JOB_LIST, "job", None),
        "ok",
        filter={k: str(v) for k, v in f.__dict__.items() if v is not None},
        count=len(page),
    )
    return {
        "items": [admin_json(state, r, arts[r.id]) for r in page],
        "nextCursor": encode_cursor(page[-1]) if len(rows) > limit else None,
    }


@router.get(
    "/{job_id}",
    response_model=AdminJobDetailResponse,
    summary="A job with its internals",
    description=(
        "`stuck` says why a queued or running job is not progressing (its enqueue event is dead "
        "or backing off; its workflow is missing, closed, or its workflow task keeps failing), "
        "computed live; null when nothing is wrong or Temporal cannot be asked in time."
    ),
)
async def get_job(job_id: uuid.UUID, state: State, admin: Admin) -> dict[str, Any]:
    audit = AuditLog(state.sessionmaker)
    entry = AuditEntry(admin.user_id, JOB_VIEW, "job", str(job_id))
    async with audit.refusals(entry), state.sessionmaker() as s:
        row = await _jobs.get(s, job_id)
        if row is None:
            raise JobNotFound("Job not found.")
        arts = await _jobs.artifacts(s, [job_id])
    await audit.record(entry, "ok")
    # After the session is returned: the stuck check may wait on Temporal for up to 2 s.
    stuck = await stuck_for(state, row)
    body = admin_json(state, row, arts[job_id])
    body["stuck"] = (
        StuckOut(reason=stuck.reason, detail=stuck.detail, since=stuck.since).model_dump(
            mode="json", by_alias=True
        )
        if stuck
        else None
    )
    return body


@router.post(
    "/{job_id}/retry",
    status_code=201,
    response_model=JobStatusResponse,
    responses={200: {"model": JobStatusResponse, "description": "Already retried: that job"}},
    summary="Retry a failed or cancelled job as a new job",
)
async def retry_job(job_id: uuid.UUID, state: State, admin: Admin) -> JSONResponse:
    audit = AuditLog(state.sessionmaker)
    entry = AuditEntry(admin.user_id, JOB_RETRY, "job", str(job_id))

    async def recorded(s: AsyncSession, new_job: JobRow) -> None:
        await audit.write(s, entry, "retried", retryJobId=str(new_job.id))

    async with audit.refusals(entry):
        result = await state.jobs.retry(job_id, within=recorded)
    if not result.created:
        await audit.record(entry, "already_retried", retryJobId=str(result.job.id))
    async with state.sessionmaker() as s:
        arts = await _jobs.artifacts(s, [result.job.id])
    body = JobStatusResponse(**status_response(result.job, arts[result.job.id])).model_dump(
        mode="json", by_alias=True
    )
    body["retriedFromJobId"] = str(job_id)
    return JSONResponse(
        body,
        status_code=201 if result.created else 200,
        headers={"Location": f"/admin-api/ai/jobs/{result.job.id}"},
    )


@router.post(
    "/{job_id}/cancel",
    response_model=CancelResponse,
    responses={202: {"model": CancelResponse, "description": "Cancel requested (job running)"}},
    summary="Cancel any job",
    description=(
        "The owner's cancel, for any user's job: a queued job is cancelled at once (200, "
        "`cancelOutcome: cancelled`); a running one is asked to stop and ends `cancelled` in "
        "its workflow (202, `cancel_requested`); an ended job is refused (409 "
        "`JOB_NOT_CANCELLABLE`, or `JOB_ALREADY_CANCELLED`)."
    ),
)
async def cancel_job(job_id: uuid.UUID, state: State, admin: Admin) -> JSONResponse:
    audit = AuditLog(state.sessionmaker)
    entry = AuditEntry(admin.user_id, JOB_CANCEL, "job", str(job_id))

    async def recorded(s: AsyncSession, outcome: str) -> None:
        await audit.write(s, entry, outcome)

    async with audit.refusals(entry):
        result = await state.jobs.cancel(
            job_id,
            admin.user_id,
            admin=True,
            cancel_workflow=state.cancel_workflow,
            within=recorded,
        )
    async with state.sessionmaker() as s:
        row = await _jobs.get(s, job_id)
        assert row is not None  # jobs are never deleted
        arts = await _jobs.artifacts(s, [job_id])
    body = JobStatusResponse(**status_response(row, arts[job_id])).model_dump(
        mode="json", by_alias=True
    )
    body["cancelOutcome"] = result.outcome
    return JSONResponse(body, status_code=200 if result.outcome == "cancelled" else 202)
