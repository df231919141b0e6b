"""Who did what as an admin: entries of the admin audit log (db/audit.py).

An action that writes to the database writes its entry in its own transaction, through
`AuditLog.write` (from a use case's `within` hook or the route's transaction): the entry exists
if and only if the action committed. A refused action (404, 409, 422) rolled back, so its entry
is written afterwards in a transaction of its own (`refusals`), with the error code as outcome.
Views of internals are entries too (outcome `ok`). Details are ids, filters and counts only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from db import audit as audit_db
from db.session import SessionMaker
from engine.errors import EngineError

# Action names (the `action` filter of GET /admin-api/ai/audit).
JOB_VIEW = "job.view"
JOB_LIST = "job.list"
JOB_CANCEL = "job.cancel"
JOB_RETRY = "job.retry"
BULK_CANCEL = "bulk.cancel"
BULK_RETRY = "bulk.retry"
OUTBOX_REQUEUE = "outbox.requeue"
DELIVERY_REPLAY = "webhook_delivery.replay"
BUDGET_PUT = "budget.put"
BUDGET_DELETE = "budget.delete"
ADMIN_WEBHOOK_CREATE = "admin_webhook.create"
ADMIN_WEBHOOK_DELETE = "admin_webhook.delete"
ADMIN_WEBHOOK_ROTATE = "admin_webhook.rotate"


@dataclass(frozen=True)
class AuditEntry:
    actor: str
    action: str
    target_type: str
    target_id: str | None
    detail: dict[str, Any] = field(default_factory=dict)


class AuditLog:
    def __init__(self, sessionmaker: SessionMaker) -> None:
        self._sm = sessionmaker

    @staticmethod
    async def write(session: AsyncSession, entry: AuditEntry, outcome: str, **detail: Any) -> None:
        """In the caller's transaction: commits or rolls back with the action."""
        await audit_db.insert(
            session,
            actor=entry.actor,
            action=entry.action,
            target_type=entry.target_type,
            target_id=entry.target_id,
            outcome=outcome,
            detail={**entry.detail, **detail},
        )

    async def record(self, entry: AuditEntry, outcome: str, **detail: Any) -> None:
        """In a transaction of its own: views, and refusals after their rollback."""
        async with self._sm.begin() as s:
            await self.write(s, entry, outcome, **detail)

    @asynccontextmanager
    async def refusals(self, entry: AuditEntry) -> AsyncIterator[None]:
        """Records a domain refusal raised inside (outcome = its public code), then re-raises.
        Unexpected errors are not recorded: nothing was decided."""
        try:
            yield
        except EngineError as exc:
            await self.record(entry, exc.code)
            raise
