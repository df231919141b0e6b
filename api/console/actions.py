"""The console's actions (POST, each CSRF-checked before anything else): one click runs the
admin route's use case with the signed-in admin, so it gives that route's answers (a refusal is
shown with its code and message, at its status) and writes the same audit entries; on success
the browser is sent back (303) to the page, which says what happened.

Bulk cancel and bulk retry are the exception to one click: the first POST is the bulk API's dry
run (the match count and a sample), the second, from that page, starts the operation on the
same filter (with an idempotency key, so a double click starts one) and leads to its progress.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from starlette.datastructures import FormData
from starlette.responses import Response

from api import cursors
from api.console import views
from api.console.csrf import Action
from api.console.pages import uuid_or
from api.console.render import ConsoleRoute, page, see_other
from api.console.sessions import ConsoleSession, state_of
from api.routes import admin, outbox
from api.routes import schedules as schedule_routes
from api.routes.admin_bulk import bulk_service
from engine.admin_errors import BulkTooLarge, OutboxEventNotFound
from engine.errors import JobNotFound, ValidationFailed
from jobs.bulk import BulkPolicy
from jobs.schedules import ScheduleNotFound

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)
JobIdText = Annotated[str, Path(alias="jobId")]


def _job_id(value: str) -> uuid.UUID:
    return uuid_or(value, JobNotFound("Job not found."))


@router.post("/jobs/{jobId}/cancel")
async def cancel_job(request: Request, session: Action, job_id: JobIdText) -> Response:
    jid = _job_id(job_id)
    done = await admin.cancel_job(jid, state_of(request), session.admin, Response())
    return see_other(f"/console/jobs/{jid}?done={done.cancel_outcome}")


@router.post("/jobs/{jobId}/retry")
async def retry_job(request: Request, session: Action, job_id: JobIdText) -> Response:
    jid = _job_id(job_id)
    answer = Response()
    retried = await admin.retry_job(jid, state_of(request), session.admin, answer, None)
    done = "retried" if answer.status_code == 201 else "already_retried"
    return see_other(f"/console/jobs/{retried.job_id}?done={done}")


@router.post("/outbox/{eventId}/requeue")
async def requeue_event(
    request: Request, session: Action, event_id: Annotated[str, Path(alias="eventId")]
) -> Response:
    missing = OutboxEventNotFound("No outbox event has this id.")
    if not event_id.isdigit() or not 1 <= int(event_id) <= cursors.INT64_MAX:
        raise missing
    await outbox.requeue_event(int(event_id), state_of(request), session.admin)
    return see_other("/console/outbox?done=requeued")


async def _set_paused(request: Request, session: ConsoleSession, sid: str, paused: bool) -> None:
    schedule_id = uuid_or(sid, ScheduleNotFound("Schedule not found."))
    act = schedule_routes.admin_pause_schedule if paused else schedule_routes.admin_resume_schedule
    await act(schedule_id, state_of(request), session.admin)


@router.post("/schedules/{scheduleId}/pause")
async def pause_schedule(
    request: Request, session: Action, schedule_id: Annotated[str, Path(alias="scheduleId")]
) -> Response:
    await _set_paused(request, session, schedule_id, True)
    return see_other("/console/schedules?done=paused")


@router.post("/schedules/{scheduleId}/resume")
async def resume_schedule(
    request: Request, session: Action, schedule_id: Annotated[str, Path(alias="scheduleId")]
) -> Response:
    await _set_paused(request, session, schedule_id, False)
    return see_other("/console/schedules?done=resumed")


def _action_of(form: FormData) -> Literal["cancel", "retry"]:
    action = form.get("action")
    if action == "cancel":
        return "cancel"
    if action == "retry":
        return "retry"
    raise ValidationFailed("The bulk action must be cancel or retry.")


@router.post("/bulk")
async def bulk(request: Request, session: Action) -> Response:
    """Step `preview`: the dry run of the form's filter. Step `confirm`: the operation."""
    form = await request.form()
    action = _action_of(form)
    filters = views.filters_of((k, v) for k, v in form.multi_items() if isinstance(v, str))
    if filters.body is None:
        raise ValidationFailed("The filter is invalid: " + "; ".join(filters.errors))
    state = state_of(request)
    service = bulk_service(state)
    limit = BulkPolicy.from_settings(state.settings).max_jobs
    actor, f, recorded = session.admin.user_id, filters.job_filter(), filters.body.filter_json()
    context: dict[str, Any] = {"action": action, "filters": filters, "limit": limit}
    if form.get("step") != "confirm":
        preview = await service.preview(actor, action, f, recorded)
        return page(
            request,
            "bulk_preview.html",
            title=f"Bulk {action}: dry run",
            session=session,
            section="jobs",
            preview=preview,
            key=str(uuid.uuid4()),
            **context,
        )
    key = form.get("key")
    try:
        submitted = await service.submit(
            actor, action, f, recorded, idempotency_key=_key(key if isinstance(key, str) else "")
        )
    except BulkTooLarge as exc:
        return page(
            request,
            "bulk_preview.html",
            title=f"Bulk {action}: refused",
            session=session,
            section="jobs",
            status_code=exc.http_status,
            too_large=exc.problem_extra,
            **context,
        )
    return see_other(f"/console/bulk/{submitted.operation.id}")


def _key(value: str) -> str | None:
    """The confirm form's idempotency key (a UUID the dry run page made), else none."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None
