"""SUPER_ADMIN routes over the transactional outbox: see its rows, requeue the stuck ones.

Rows are shown without their payload (only its `jobId`): what an operator needs to find and
repair a row, nothing a job carried.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from api import cursors
from api.deps import Admin, State
from api.schemas import EVENT_TYPE_PATTERN, OutboxEventOut, OutboxPage, OutboxStatus
from db import outbox_admin as outbox_admin_db
from db.outbox_admin import OutboxSummary
from engine.admin_errors import OutboxEventNotFound, OutboxNotRequeueable
from jobs.audit import OUTBOX_REQUEUE, AuditEntry, AuditLog

log = logging.getLogger(__name__)
router = APIRouter(prefix="/admin-api/ai/outbox", tags=["admin"])

LAST_ERROR_CHARS = 500
# The statuses as the specification (ADR-003 §4.4) names them; the OpenAPI text of the list.
STATUS_MEANINGS = (
    "Statuses: `pending` (waiting, or backing off after a failed attempt), `processing` "
    "(claimed by a relay), `published` (done), `dead` (its 3 attempts used up, "
    "`attemptCount` >= 3; the reconciler sends a dead enqueue again while its job waits), "
    "`failed` (can never be dispatched, e.g. a payload without `jobId`: parked at its first "
    "claim and never retried). `dead` and `failed` rows wait for `POST .../requeue`."
)
_CURSOR_PREFIX = "outbox:"


def event_json(row: OutboxSummary) -> dict[str, Any]:
    return OutboxEventOut(
        id=row.id,
        event_type=row.event_type,
        aggregate_id=row.aggregate_id,
        status=row.status,  # the CHECK constraint keeps it one of OutboxStatus
        attempt_count=row.attempt_count,
        available_at=row.available_at,
        locked_by=row.locked_by,
        last_error=row.last_error[:LAST_ERROR_CHARS] if row.last_error else row.last_error,
        published_at=row.published_at,
        created_at=row.created_at,
        job_id=row.job_id,
    ).model_dump(mode="json", by_alias=True)


def encode_cursor(row: OutboxSummary) -> str:
    return cursors.encode_ints(_CURSOR_PREFIX, row.id)


def decode_cursor(cursor: str | None) -> int | None:
    return cursors.decode_id(cursor, _CURSOR_PREFIX)


@router.get(
    "",
    response_model=OutboxPage,
    summary="List outbox events, newest first",
    description=(
        "Newest first (descending id), filtered by `status` and `eventType`; `nextCursor` "
        "continues after the last item and is stable under inserts. Payloads are not shown, "
        "except their `jobId`; `lastError` is cut to 500 characters.\n\n" + STATUS_MEANINGS
    ),
)
async def list_events(
    state: State,
    _admin: Admin,
    status_: Annotated[
        OutboxStatus | None,
        Query(alias="status", description="Only rows in this status. " + STATUS_MEANINGS),
    ] = None,
    event_type: Annotated[str | None, Query(alias="eventType", pattern=EVENT_TYPE_PATTERN)] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    before = decode_cursor(cursor)
    async with state.sessionmaker() as s:
        rows = await outbox_admin_db.list_page(
            s, status=status_, event_type=event_type, before_id=before, limit=limit + 1
        )
    page = rows[:limit]
    return {
        "items": [event_json(r) for r in page],
        "nextCursor": encode_cursor(page[-1]) if len(rows) > limit else None,
    }


@router.post(
    "/{eventId}/requeue",
    response_model=OutboxEventOut,
    summary="Requeue a dead, failed or backing-off outbox event",
    description=(
        "The event goes back to `pending` with `attemptCount` 0, available now, and the relays "
        "are woken. `lastError` is kept until the next failure replaces it. A `published` or "
        "`processing` event is refused (409 `OUTBOX_NOT_REQUEUEABLE`); an unknown id is 404 "
        "`OUTBOX_EVENT_NOT_FOUND`."
    ),
    responses={
        404: {"description": "No such event (problem+json, `OUTBOX_EVENT_NOT_FOUND`)"},
        409: {"description": "Published or being dispatched (`OUTBOX_NOT_REQUEUEABLE`)"},
    },
)
async def requeue_event(
    event_id: Annotated[int, Path(alias="eventId", ge=1, le=cursors.INT64_MAX)],
    state: State,
    admin: Admin,
) -> dict[str, Any]:
    audit = AuditLog(state.sessionmaker)
    entry = AuditEntry(admin.user_id, OUTBOX_REQUEUE, "outbox_event", str(event_id))
    async with audit.refusals(entry), state.sessionmaker.begin() as s:
        requeued = await outbox_admin_db.requeue(s, [event_id])
        if not requeued:
            current = await outbox_admin_db.get_summary(s, event_id)
            if current is None:
                raise OutboxEventNotFound("No outbox event has this id.")
            raise OutboxNotRequeueable(
                f"The event is {current.status}: only dead, failed or pending events can be "
                "requeued."
            )
        (row,) = requeued
        # In the requeue's transaction: the entry exists if and only if the requeue does.
        await audit.write(s, entry, "requeued", eventType=row.event_type, jobId=row.job_id)
    log.info(
        "outbox event requeued",
        extra={"event_id": row.id, "job_id": row.job_id, "admin": admin.user_id},
    )
    return event_json(row)
