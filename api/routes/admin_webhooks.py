"""SUPER_ADMIN routes: admin webhooks, the receivers of deployment-wide events (for now a
budget's `ai.budget.threshold_crossed`, docs/webhooks.md). They are users' webhooks in every
other way (Standard Webhooks signatures with a `whsec_` secret, retries, the receiver URL rule,
the deliveries list and replay), owned by the reserved admin owner: every admin sees every
admin webhook, no user sees any. Create, delete and rotate write their audit entries
(`admin_webhook.*`) in their own transactions."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response, status
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field
from sqlalchemy.ext.asyncio import AsyncSession

from api.deps import Admin, State, WebhookId
from api.limits import TOO_LARGE_RESPONSE
from api.routes.webhooks import (
    WebhookList,
    WebhookOut,
    WebhookWithSecret,
    endpoint_view,
    with_secret,
)
from api.schemas import Camel
from db.webhooks import ADMIN_EVENTS, ADMIN_OWNER, AdminWebhookEvent
from jobs.audit import (
    ADMIN_WEBHOOK_CREATE,
    ADMIN_WEBHOOK_DELETE,
    ADMIN_WEBHOOK_ROTATE,
    AuditEntry,
    AuditLog,
)
from jobs.webhooks import Within

router = APIRouter(prefix="/admin-api/ai/webhooks", tags=["admin"])


class CreateAdminWebhookBody(Camel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048)
    event_types: list[AdminWebhookEvent] | None = Field(
        default=None, min_length=1, max_length=len(ADMIN_EVENTS)
    )


def _audited(state: State, admin: Admin, action: str) -> tuple[AuditLog, AuditEntry, Within]:
    """The audit log, its entry for `action`, and the hook that writes it in the action's
    transaction, naming the webhook."""
    audit = AuditLog(state.sessionmaker)
    entry = AuditEntry(admin.user_id, action, "admin_webhook", None)

    async def within(s: AsyncSession, webhook_id: uuid.UUID) -> None:
        await audit.write(s, entry, "ok", webhookId=str(webhook_id))

    return audit, entry, within


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=WebhookWithSecret,
    responses=TOO_LARGE_RESPONSE,
    summary="Register an admin webhook for deployment-wide events",
    description=(
        "Deliveries of `eventTypes` (default, and for now the only one: "
        "ai.budget.threshold_crossed) are POSTed to `url`, signed per the Standard Webhooks "
        "spec, as users' webhooks are. The answer carries the signing `secret`, shown only "
        "here. Audited as `admin_webhook.create`."
    ),
)
async def create_admin_webhook(
    body: CreateAdminWebhookBody, state: State, admin: Admin
) -> JSONResponse:
    audit, entry, within = _audited(state, admin, ADMIN_WEBHOOK_CREATE)
    async with audit.refusals(entry):
        row, secret = await state.webhooks.create(
            ADMIN_OWNER, body.url, body.event_types, default_events=ADMIN_EVENTS, within=within
        )
    return JSONResponse(
        with_secret(row, secret),
        status_code=201,
        headers={"Location": f"/admin-api/ai/webhooks/{row.id}", "Cache-Control": "no-store"},
    )


@router.get("", response_model=WebhookList, summary="List the admin webhooks")
async def list_admin_webhooks(state: State, _admin: Admin) -> WebhookList:
    rows = await state.webhooks.list(ADMIN_OWNER)
    return WebhookList(items=[WebhookOut(**endpoint_view(r)) for r in rows])


@router.delete(
    "/{webhookId}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Remove an admin webhook",
    description="Its undelivered deliveries are dropped; a missing one is 404. Audited as "
    "`admin_webhook.delete`.",
)
async def delete_admin_webhook(webhook_id: WebhookId, state: State, admin: Admin) -> Response:
    audit, entry, within = _audited(state, admin, ADMIN_WEBHOOK_DELETE)
    async with audit.refusals(entry):
        await state.webhooks.delete(ADMIN_OWNER, webhook_id, within=within)
    return Response(status_code=204)


@router.post(
    "/{webhookId}/rotate",
    response_model=WebhookWithSecret,
    summary="Rotate an admin webhook's signing secret",
    description="As for users' webhooks: the previous secret keeps signing (a second "
    "signature) for WEBHOOK_ROTATION_GRACE_S. Audited as `admin_webhook.rotate`.",
)
async def rotate_admin_webhook(webhook_id: WebhookId, state: State, admin: Admin) -> JSONResponse:
    audit, entry, within = _audited(state, admin, ADMIN_WEBHOOK_ROTATE)
    async with audit.refusals(entry):
        row, secret = await state.webhooks.rotate(ADMIN_OWNER, webhook_id, within=within)
    return JSONResponse(with_secret(row, secret), headers={"Cache-Control": "no-store"})
