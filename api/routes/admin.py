"""SUPER_ADMIN routes: list/filter any job, see internals (and why it is stuck), cancel any job,
retry failed or cancelled jobs. Each is recorded in the admin audit log (jobs/audit.py): the
actions in their own transaction, the views of internals and the refusals afterwards."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BeforeValidator
from sqlalchemy.ext.asyncio import AsyncSession

from api.auth import Principal
from api.deps import Admin, JobId, State
from api.routes.jobs import metadata_filter
from api.schemas import (
    JOB_TYPE_PATTERN,
    NO_NUL,
    AdminJobDetailResponse,
    AdminJobPage,
    CancelResponse,
    Queue,
    RetriedJobResponse,
    RetryBody,
    Status,
    StuckOut,
    decode_cursor,
    encode_cursor,
)
from api.state import AppState
from api.stuck import stuck_for
from db.jobs import JobFilter, JobRow
from jobs import views
from jobs.audit import JOB_CANCEL, JOB_LIST, JOB_RETRY, JOB_VIEW, AuditEntry, AuditLog
from jobs.views import JobStatusResponse, TemporalLink

router = APIRouter(prefix="/admin-api/ai/jobs", tags=["admin"])
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")
ERROR_CODE_PATTERN = r"^[A-Z][A-Z0-9_]{0,63}$"


def iso_datetime(value: Any) -> Any:
    """An RFC 3339 date-time, as documented: not a bare number (read as a Unix time), whether
    in a query string or as a JSON number in a body."""
    if (isinstance(value, str) and not _ISO_DATE.match(value)) or isinstance(value, int | float):
        raise ValueError("must be an RFC 3339 date-time")
    return value


_TARGET_TYPE = Query(
    alias="targetType",
    min_length=1,
    max_length=64,
    pattern=NO_NUL,
    description="Only jobs about this kind of thing (the create's `targetType`)",
)
_TARGET_ID = Query(
    alias="targetId",
    min_length=1,
    max_length=128,
    pattern=NO_NUL,
    description="Only jobs about this thing (the create's `targetId`)",
)


@router.get(
    "",
    response_model=AdminJobPage,
    summary="List and filter all jobs",
    description=(
        "Every user's jobs, newest first, filtered by `status`, `jobType`, `userId`, "
        "`queueName`, `targetType`, `targetId`, `metadata.<key>=<value>` (repeatable; a job "
        "must hold every pair), `createdFrom` (inclusive), `createdTo` (exclusive) and "
        "`errorCode`, combined with AND: the filters of the bulk routes. Paged: pass "
        "`nextCursor` back as `cursor`."
    ),
)
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
    target_type: Annotated[str | None, _TARGET_TYPE] = None,
    target_id: Annotated[str | None, _TARGET_ID] = None,
    error_code: Annotated[
        str | None, Query(alias="errorCode", max_length=64, pattern=ERROR_CODE_PATTERN)
    ] = None,
    metadata: Annotated[tuple[tuple[str, str], ...], Depends(metadata_filter)] = (),
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> AdminJobPage:
    f = JobFilter(
        user_id=user_id,
        job_type=job_type,
        status=status_,
        queue_name=queue_name,
        created_from=created_from,
        created_to=created_to,
        error_code=error_code,
        target_type=target_type,
        target_id=target_id,
        metadata=metadata,
    )
    return await job_list(state, admin, f, cursor=cursor, limit=limit)


async def job_list(
    state: AppState, admin: Principal, f: JobFilter, *, cursor: str | None, limit: int
) -> AdminJobPage:
    """The admin list's use case (this route's and the console's jobs page): a page of any
    user's jobs with their internals, and its `job.list` audit entry."""
    after = decode_cursor(cursor)
    link = TemporalLink.from_settings(state.settings)
    async with state.sessionmaker() as s:
        page = await views.admin_job_page(s, f, link, after=after, limit=limit)
    # The page shows every listed job's internalErrorMessage: a view of internals.
    await AuditLog(state.sessionmaker).record(
        AuditEntry(admin.user_id, JOB_LIST, "job", None),
        "ok",
        filter=_filter_detail(f),
        count=len(page.items),
    )
    return AdminJobPage(items=page.items, next_cursor=encode_cursor(page.next_after))


def _filter_detail(f: JobFilter) -> dict[str, str]:
    """The filter as the audit entry records it: each given filter as text (metadata pairs
    as `metadata.<key>`)."""
    detail = {k: str(v) for k, v in f.__dict__.items() if v is not None and k != "metadata"}
    detail.update({f"metadata.{k}": v for k, v in f.metadata})
    return detail


@router.get(
    "/{jobId}",
    response_model=AdminJobDetailResponse,
    summary="A job with its internals",
    description=(
        "`stuck` says why a queued or running job is not progressing (its enqueue event is dead "
        "or backing off; its workflow is missing, closed, or its workflow task keeps failing), "
        "computed live; null when nothing is wrong or Temporal cannot be asked in time."
    ),
)
async def get_job(job_id: JobId, state: State, admin: Admin) -> AdminJobDetailResponse:
    audit = AuditLog(state.sessionmaker)
    entry = AuditEntry(admin.user_id, JOB_VIEW, "job", str(job_id))
    async with audit.refusals(entry), state.sessionmaker() as s:
        job = await views.read_job(s, job_id, admin)
    await audit.record(entry, "ok")
    # After the session is returned: the stuck check may wait on Temporal for up to 2 s.
    stuck = await stuck_for(state, job.row)
    return AdminJobDetailResponse(
        **dict(job.admin_view(TemporalLink.from_settings(state.settings))),
        stuck=StuckOut(reason=stuck.reason, detail=stuck.detail, since=stuck.since)
        if stuck
        else None,
    )


@router.post(
    "/{jobId}/retry",
    status_code=201,
    # The body is JobStatusResponse plus `retriedFromJobId` (RetriedJobResponse): declared as
    # the documented JobStatusResponse, and rendered from the model as it is returned.
    response_model=None,
    responses={
        201: {"model": JobStatusResponse},
        200: {"model": JobStatusResponse, "description": "Already retried: that job"},
        429: {
            "description": (
                "The owner's quotas or cost budgets refuse the retry (problem+json, `code` "
                "`QUOTA_EXCEEDED`, or `TOO_MANY_JOBS` for the active-jobs quota, with "
                "Retry-After), exactly as they would refuse the owner's create"
            ),
            "content": {
                "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
            },
        },
    },
    summary="Retry a failed or cancelled job as a new job",
    description=(
        "The retry is a new job of the same owner, request and credential choice (the "
        "original's mode and pinned key; a revoked key: 409 `JOB_NOT_RETRYABLE`). It reserves "
        "against the OWNER's quotas and cost budgets like the owner's create: past them, 429 "
        '`QUOTA_EXCEEDED` with Retry-After. The body is optional; `{"overrideBudget": true}` '
        "creates the retry past them, recorded as `detail.overrideBudget: true` on the "
        "`job.retry` audit entry (outcome `retried`). One retry per job: a job retried before "
        "answers 200 with that retry."
    ),
)
async def retry_job(
    job_id: JobId,
    state: State,
    admin: Admin,
    response: Response,
    body: RetryBody | None = None,
) -> RetriedJobResponse:
    audit = AuditLog(state.sessionmaker)
    entry = AuditEntry(admin.user_id, JOB_RETRY, "job", str(job_id))
    override = body is not None and body.override_budget
    # Present only when set: an entry without it was a retry within the owner's budgets.
    overridden: dict[str, bool] = {"overrideBudget": True} if override else {}

    async def recorded(s: AsyncSession, new_job: JobRow) -> None:
        await audit.write(s, entry, "retried", retryJobId=str(new_job.id), **overridden)

    async with audit.refusals(entry):
        result = await state.jobs.retry(job_id, within=recorded, override_budget=override)
    if not result.created:
        await audit.record(entry, "already_retried", retryJobId=str(result.job.id))
    response.status_code = 201 if result.created else 200
    response.headers["Location"] = f"/admin-api/ai/jobs/{result.job.id}"
    job = await views.present(state.sessionmaker, result.job)
    return RetriedJobResponse(**dict(job), retried_from_job_id=job_id)


@router.post(
    "/{jobId}/cancel",
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
async def cancel_job(
    job_id: JobId, state: State, admin: Admin, response: Response
) -> CancelResponse:
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
        job = await views.job_status(s, job_id, admin)
    response.status_code = 200 if result.outcome == "cancelled" else 202
    return CancelResponse(**dict(job), cancel_outcome=result.outcome)
