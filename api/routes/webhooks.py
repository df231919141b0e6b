"""Signed webhooks: a user registers receivers for their jobs' ends; admins see and replay
deliveries. See docs/webhooks.md.

The signing secret leaves only in the answer that creates it (registration, rotation); lists
never show it. Someone else's or a missing webhook is 404.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response, status
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field

from api import cursors
from api.deps import Admin, State, User, WebhookId
from api.errors import PROBLEM
from api.limits import TOO_LARGE_RESPONSE
from api.schemas import Camel
from db import webhook_deliveries as webhooks_db
from db.webhook_deliveries import DeliveryRow, DeliveryStatus
from db.webhooks import EndpointRow, WebhookEvent
from engine.errors import (
    WebhookDeliveryNotFound,
    WebhookDeliveryNotReplayable,
)
from jobs.audit import DELIVERY_REPLAY, AuditEntry, AuditLog
from jobs.webhooks import MAX_ENDPOINTS_PER_USER, ROTATION_GRACE_S, WebhookService

log = logging.getLogger(__name__)
router = APIRouter(tags=["webhooks"])

EventType = WebhookEvent
_CURSOR_PREFIX = "whd:"


class CreateWebhookBody(Camel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048)
    event_types: list[EventType] | None = Field(default=None, min_length=1, max_length=3)


class WebhookOut(Camel):
    webhook_id: uuid.UUID
    url: str
    event_types: list[str]
    created_at: datetime
    previous_secret_valid_until: datetime | None = None


class WebhookWithSecret(WebhookOut):
    secret: str = Field(description="`whsec_` + base64 of the signing key; shown only here.")


class WebhookList(Camel):
    items: list[WebhookOut]


class WebhookDeliveryOut(Camel):
    id: int
    endpoint_id: uuid.UUID
    message_id: str = Field(description="The `webhook-id` header, stable across retries.")
    event_id: int
    job_id: str
    event_type: str
    status: DeliveryStatus
    attempt_count: int
    next_attempt_at: datetime
    last_status_code: int | None = None
    last_error: str | None = None
    created_at: datetime
    delivered_at: datetime | None = None


class WebhookDeliveryPage(Camel):
    items: list[WebhookDeliveryOut]
    next_cursor: str | None = None


def _service(state: State) -> WebhookService:
    return state.webhooks


def endpoint_view(row: EndpointRow) -> dict[str, Any]:
    return {
        "webhook_id": row.id,
        "url": row.url,
        "event_types": list(row.event_types),
        "created_at": row.created_at,
        "previous_secret_valid_until": row.previous_valid_until,
    }


def with_secret(row: EndpointRow, secret: str) -> dict[str, Any]:
    return WebhookWithSecret(**endpoint_view(row), secret=secret).model_dump(
        mode="json", by_alias=True
    )


def _delivery(row: DeliveryRow) -> dict[str, Any]:
    return WebhookDeliveryOut(
        id=row.id,
        endpoint_id=row.endpoint_id,
        message_id=row.webhook_id,
        event_id=row.event_id,
        job_id=row.job_id,
        event_type=row.event_type,
        status=row.status,  # the CHECK constraint keeps it one of DeliveryStatus
        attempt_count=row.attempt_count,
        next_attempt_at=row.next_attempt_at,
        last_status_code=row.last_status_code,
        last_error=row.last_error,
        created_at=row.created_at,
        delivered_at=row.delivered_at,
    ).model_dump(mode="json", by_alias=True)


# ---- users -------------------------------------------------------------------------------------


@router.post(
    "/api/ai/webhooks",
    status_code=status.HTTP_201_CREATED,
    response_model=WebhookWithSecret,
    responses={
        **TOO_LARGE_RESPONSE,
        409: {
            "description": f"You already have {MAX_ENDPOINTS_PER_USER} webhooks "
            "(`WEBHOOK_LIMIT_REACHED`); delete one first",
            "content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        },
    },
    summary="Register a webhook for your jobs' ends",
    description=(
        "Deliveries of `eventTypes` (default: all of ai.job.completed, ai.job.failed, "
        "ai.job.cancelled) are POSTed to `url`, signed per the Standard Webhooks spec. The "
        "answer carries the signing `secret`, which is never shown again. In production the "
        "URL must be https and resolve to public addresses only. A user has at most "
        f"{MAX_ENDPOINTS_PER_USER} webhooks: past it, 409 "
        "`WEBHOOK_LIMIT_REACHED`."
    ),
)
async def create_webhook(body: CreateWebhookBody, state: State, principal: User) -> JSONResponse:
    row, secret = await _service(state).create(principal.user_id, body.url, body.event_types)
    return JSONResponse(
        with_secret(row, secret),
        status_code=201,
        headers={"Location": f"/api/ai/webhooks/{row.id}", "Cache-Control": "no-store"},
    )


@router.get("/api/ai/webhooks", response_model=WebhookList, summary="List your webhooks")
async def list_webhooks(state: State, principal: User) -> WebhookList:
    rows = await _service(state).list(principal.user_id)
    return WebhookList(items=[WebhookOut(**endpoint_view(r)) for r in rows])


@router.delete(
    "/api/ai/webhooks/{webhookId}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Remove one of your webhooks",
    description="Its undelivered deliveries are dropped. Someone else's or a missing one → 404.",
)
async def delete_webhook(webhook_id: WebhookId, state: State, principal: User) -> Response:
    await _service(state).delete(principal.user_id, webhook_id)
    return Response(status_code=204)


@router.post(
    "/api/ai/webhooks/{webhookId}/rotate",
    response_model=WebhookWithSecret,
    summary="Rotate a webhook's signing secret",
    description=(
        "Returns a new secret. The previous one stays valid for "
        f"{ROTATION_GRACE_S / 3600:g} h: meanwhile deliveries carry two signatures, one per secret."
    ),
)
async def rotate_webhook(webhook_id: WebhookId, state: State, principal: User) -> JSONResponse:
    row, secret = await _service(state).rotate(principal.user_id, webhook_id)
    return JSONResponse(with_secret(row, secret), headers={"Cache-Control": "no-store"})


# ---- admins --------------------------------------------------------------------------------------


def _encode_cursor(delivery_id: int) -> str:
    return cursors.encode_ints(_CURSOR_PREFIX, delivery_id)


def _decode_cursor(cursor: str | None) -> int | None:
    return cursors.decode_id(cursor, _CURSOR_PREFIX)


@router.get(
    "/admin-api/ai/webhook-deliveries",
    response_model=WebhookDeliveryPage,
    tags=["admin"],
    summary="List webhook deliveries, newest first",
)
async def list_deliveries(
    state: State,
    _admin: Admin,
    status_: Annotated[DeliveryStatus | None, Query(alias="status")] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    before = _decode_cursor(cursor)
    async with state.sessionmaker() as s:
        rows = await webhooks_db.list_deliveries(
            s, status=status_, before_id=before, limit=limit + 1
        )
    page = rows[:limit]
    return {
        "items": [_delivery(r) for r in page],
        "nextCursor": _encode_cursor(page[-1].id) if len(rows) > limit else None,
    }


@router.post(
    "/admin-api/ai/webhook-deliveries/{deliveryId}/replay",
    response_model=WebhookDeliveryOut,
    tags=["admin"],
    summary="Send a delivered, failed or dead webhook delivery again",
    description=(
        "Same `webhook-id`, fresh attempts and retry window, due now. A pending delivery is "
        "refused (409 `WEBHOOK_DELIVERY_NOT_REPLAYABLE`); an unknown id is 404."
    ),
)
async def replay_delivery(
    delivery_id: Annotated[int, Path(alias="deliveryId", ge=1, le=cursors.INT64_MAX)],
    state: State,
    admin: Admin,
) -> dict[str, Any]:
    audit = AuditLog(state.sessionmaker)
    entry = AuditEntry(admin.user_id, DELIVERY_REPLAY, "webhook_delivery", str(delivery_id))
    async with audit.refusals(entry), state.sessionmaker.begin() as s:
        row = await webhooks_db.replay(s, delivery_id)
        if row is None:
            current = await webhooks_db.get_delivery(s, delivery_id)
            if current is None:
                raise WebhookDeliveryNotFound("No webhook delivery has this id.")
            raise WebhookDeliveryNotReplayable(f"The delivery is {current.status}.")
        # In the replay's transaction: the entry exists if and only if the replay does.
        await audit.write(s, entry, "replayed", jobId=row.job_id)
    log.info("webhook delivery replayed", extra={"delivery_id": row.id, "admin": admin.user_id})
    return _delivery(row)
