"""The console's pages (GET): each one's data is in its HTML, read through the admin use cases
(`api/routes/admin*.py`, `api/routes/usage.py`, `api/routes/outbox.py`,
`api/routes/schedules.py`), so a page shows what the admin API answers and writes the audit
entries it writes (`job.list`, `job.view`, `schedule.list`). GET changes nothing else.
"""

from __future__ import annotations

import uuid
from datetime import date
from decimal import Decimal
from typing import Annotated, get_args

from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from api.console import views
from api.console.render import ConsoleRoute, page, see_other
from api.console.sessions import Console, state_of
from api.routes import admin, admin_bulk, outbox, usage
from api.routes import schedules as schedule_routes
from api.schemas import OutboxStatus
from db import outbox_admin as outbox_admin_db
from db import schedules as schedules_db
from engine.admin_errors import BulkOperationNotFound
from engine.definition import QueueName
from engine.errors import EngineError, JobNotFound
from engine.lifecycle import StatusName
from jobs import views as job_views
from jobs.bulk import BulkPolicy

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)
PathText = Annotated[str, Path()]
RECENT_RUNS = 5
ARTIFACTS = 100
PARKED: tuple[OutboxStatus, ...] = ("dead", "failed")
STATUSES = get_args(StatusName)
QUEUES = get_args(QueueName)


class PageNotFound(EngineError):
    code = "NOT_FOUND"
    http_status = 404
    title = "Not found"


def uuid_or(value: str, missing: EngineError) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise missing from None


@router.get("/jobs")
async def jobs_page(request: Request, session: Console) -> Response:
    params = request.query_params
    if params.get(views.NEW_KEY, "").strip():
        # A metadata filter typed into the form becomes its shareable `metadata.<key>=` name.
        pairs = [(k, v) for k, v in params.multi_items() if k not in (views.NEW_KEY, "cursor")]
        key = views.METADATA + params[views.NEW_KEY].strip()
        pairs.append((key, params.get(views.NEW_VALUE, "")))
        return see_other(f"/console/jobs?{views.filters_of(pairs).query()}")
    filters = views.filters_of(params.multi_items())
    limit = views.limit_of(params.get("limit"))
    listed = None
    if filters.body is not None:
        listed = await admin.job_list(
            state_of(request),
            session.admin,
            filters.job_filter(),
            cursor=params.get("cursor") or None,
            limit=limit,
        )
    status = 200 if filters.body is not None else 400
    return page(
        request,
        "jobs.html",
        title="Jobs",
        session=session,
        section="jobs",
        status_code=status,
        filters=filters,
        jobs=listed.items if listed else [],
        next_query=filters.query(cursor=listed.next_cursor, limit=limit)
        if listed and listed.next_cursor
        else None,
        statuses=STATUSES,
        queues=QUEUES,
        limit=limit,
    )


@router.get("/jobs/{jobId}")
async def job_page(
    request: Request, session: Console, job_id: Annotated[str, Path(alias="jobId")]
) -> Response:
    state = state_of(request)
    jid = uuid_or(job_id, JobNotFound("Job not found."))
    job = await admin.get_job(jid, state, session.admin)  # writes the job.view entry
    spent = await usage.job_usage(jid, state, session.admin)
    async with state.sessionmaker() as s:
        events = await outbox_admin_db.for_aggregate(s, str(jid))
        artifacts = await job_views.artifact_page(
            s, state.catalog, jid, session.admin, after=None, limit=ARTIFACTS
        )
    return page(
        request,
        "job.html",
        title=f"Job {jid}",
        session=session,
        section="jobs",
        job=job,
        usage=spent,
        events=events,
        artifacts=artifacts.items,
        more_artifacts=artifacts.next_after is not None,
        notice=views.notice(request.query_params.get("done")),
    )


@router.get("/outbox")
async def outbox_page(request: Request, session: Console) -> Response:
    state = state_of(request)
    parked = {
        status: await outbox.list_events(
            state, session.admin, status_=status, event_type=None, cursor=None, limit=100
        )
        for status in PARKED
    }
    rows = sorted((row for p in parked.values() for row in p["items"]), key=lambda r: -int(r["id"]))
    return page(
        request,
        "outbox.html",
        title="Outbox",
        session=session,
        section="outbox",
        rows=rows,
        more=any(p["nextCursor"] for p in parked.values()),
        notice=views.notice(request.query_params.get("done")),
    )


@router.get("/schedules")
async def schedules_page(request: Request, session: Console) -> Response:
    state = state_of(request)
    cursor = request.query_params.get("cursor") or None
    listed = await schedule_routes.admin_list_schedules(
        state, session.admin, user_id=None, cursor=cursor, limit=50
    )
    async with state.sessionmaker() as s:
        runs = await schedules_db.recent_runs_of(
            s, [x.schedule_id for x in listed.items], RECENT_RUNS
        )
    return page(
        request,
        "schedules.html",
        title="Schedules",
        session=session,
        section="schedules",
        schedules=listed.items,
        runs=runs,
        next_cursor=listed.next_cursor,
        notice=views.notice(request.query_params.get("done")),
    )


@router.get("/spend")
async def spend_page(request: Request, session: Console) -> Response:
    state = state_of(request)
    reports = {
        group: await usage.admin_usage(
            state,
            session.admin,
            from_=None,
            to=None,
            group_by=group,
            user_id=None,
            job_type=None,
            model=None,
            credential_mode=None,
        )
        for group in ("day", "jobType", "model")
    }
    by_day = reports["day"]
    costs: dict[str, Decimal] = {item.key: item.cost_usd for item in by_day.items}
    first: date = by_day.from_
    return page(
        request,
        "spend.html",
        title="Spend",
        session=session,
        section="spend",
        reports=reports,
        total=by_day.total,
        chart=views.spend_chart(first, by_day.to, costs),
    )


@router.get("/bulk/{operationId}")
async def bulk_page(
    request: Request, session: Console, operation_id: Annotated[str, Path(alias="operationId")]
) -> Response:
    oid = uuid_or(operation_id, BulkOperationNotFound("No bulk operation has this id."))
    op = await admin_bulk.get_operation(oid, state_of(request), session.admin)
    return page(
        request,
        "bulk.html",
        title="Bulk operation",
        session=session,
        section="jobs",
        op=op,
        limit=BulkPolicy.from_settings(state_of(request).settings).max_jobs,
    )


@router.get("/{rest:path}")
async def not_found(request: Request, session: Console, rest: PathText) -> Response:
    raise PageNotFound("The console has no such page.")
