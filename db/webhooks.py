"""Webhook endpoints: a user's receivers and their signing secrets (see docs/webhooks.md).

A user registers, lists and deletes only their own endpoints; a deleted one is kept (soft
delete) so that its past deliveries still name it, and receives nothing new. A secret rotation
keeps the previous secret valid for a grace period, so a receiver can switch without dropping a
delivery. The deliveries themselves live in db/webhook_deliveries.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from db.outbox import CANCELLED, COMPLETED, FAILED

# The API validates against this Literal; the tuple is the same values for SQL. A type checker
# cannot build a Literal from constants, so the import-time check keeps them one fact.
WebhookEvent = Literal[
    "ai.job.completed", "ai.job.failed", "ai.job.cancelled", "ai.schedule.run_refused"
]
WEBHOOK_EVENTS: tuple[str, ...] = get_args(WebhookEvent)
# The job events, an endpoint's default subscription. A schedule's refused run
# (jobs/schedules.py) is opt-in, and delivered from its own rows, not by FAN_OUT.
JOB_EVENTS: tuple[str, ...] = WEBHOOK_EVENTS[:3]
if JOB_EVENTS != (COMPLETED, FAILED, CANCELLED):
    raise RuntimeError("WebhookEvent must list the outbox's terminal event names")

# Admin webhooks receive deployment-wide events: endpoints whose owner is ADMIN_OWNER, which no
# token's `sub` can be (a token's subject is never empty), so no user lists, deletes or rotates
# them, and every admin sees all of them. Their one event type for now: a budget's threshold
# (written by the trigger of migration 0037, db/scope_budgets.py).
ADMIN_OWNER = ""
AdminWebhookEvent = Literal["ai.budget.threshold_crossed"]
ADMIN_EVENTS: tuple[str, ...] = get_args(AdminWebhookEvent)


@dataclass(frozen=True)
class EndpointRow:
    id: uuid.UUID
    user_id: str
    url: str
    event_types: list[str]
    key_id: str
    secret_ciphertext: bytes
    previous_key_id: str | None
    previous_secret_ciphertext: bytes | None
    previous_valid_until: datetime | None
    created_at: datetime
    deleted_at: datetime | None


# The statements of this module interpolate only its own constants (these column lists, a fixed
# " FOR UPDATE"); every value a caller passes (ids, URLs, statuses, limits) is a bind parameter.
_ENDPOINT = (
    "id, user_id, url, event_types, key_id, secret_ciphertext, previous_key_id, "
    "previous_secret_ciphertext, previous_valid_until, created_at, deleted_at"
)


# ---- endpoints -------------------------------------------------------------------------------


async def insert_endpoint(
    session: AsyncSession,
    *,
    endpoint_id: uuid.UUID,
    user_id: str,
    url: str,
    event_types: Sequence[str],
    key_id: str,
    ciphertext: bytes,
) -> EndpointRow:
    row = (
        await session.execute(
            text(
                f"""
                INSERT INTO webhook_endpoint (id, user_id, url, event_types, key_id,
                                              secret_ciphertext, created_at)
                VALUES (:id, :uid, :url, :types, :kid, :blob, now())
                RETURNING {_ENDPOINT}
                """
            ).bindparams(bindparam("types", type_=JSONB)),
            {
                "id": endpoint_id,
                "uid": user_id,
                "url": url,
                "types": list(event_types),
                "kid": key_id,
                "blob": ciphertext,
            },
        )
    ).one()
    return EndpointRow(**row._mapping)


async def lock_user_endpoints(session: AsyncSession, user_id: str) -> int:
    """Serialise endpoint registrations of one user until the transaction ends (an advisory
    lock keyed by the user id) and return how many live endpoints the user has: a
    count-then-insert under it cannot overshoot the per-user cap, however many requests race."""
    await session.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended('webhook_endpoint:' || :u, 0))"),
        {"u": user_id},
    )
    n = await session.scalar(
        text("SELECT count(*) FROM webhook_endpoint WHERE user_id = :u AND deleted_at IS NULL"),
        {"u": user_id},
    )
    return int(n or 0)


async def get_endpoint(
    session: AsyncSession, endpoint_id: uuid.UUID, *, for_update: bool = False
) -> EndpointRow | None:
    lock = " FOR UPDATE" if for_update else ""  # a constant clause, never a caller's text
    row = (
        await session.execute(
            text(f"SELECT {_ENDPOINT} FROM webhook_endpoint WHERE id = :id{lock}"),
            {"id": endpoint_id},
        )
    ).first()
    return EndpointRow(**row._mapping) if row else None


async def list_endpoints(session: AsyncSession, user_id: str) -> list[EndpointRow]:
    rows = await session.execute(
        text(
            f"SELECT {_ENDPOINT} FROM webhook_endpoint "
            "WHERE user_id = :uid AND deleted_at IS NULL ORDER BY created_at, id"
        ),
        {"uid": user_id},
    )
    return [EndpointRow(**r._mapping) for r in rows]


async def delete_endpoint(session: AsyncSession, user_id: str, endpoint_id: uuid.UUID) -> bool:
    """Soft delete (deliveries keep their history); pending deliveries are dropped (dead)."""
    result = await session.execute(
        text(
            "UPDATE webhook_endpoint SET deleted_at = now() "
            "WHERE id = :id AND user_id = :uid AND deleted_at IS NULL"
        ),
        {"id": endpoint_id, "uid": user_id},
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        return False
    await session.execute(
        text(
            "UPDATE webhook_delivery SET status = 'dead', last_error = 'endpoint deleted', "
            "finished_at = now() WHERE endpoint_id = :id AND status IN ('pending', 'failed')"
        ),
        {"id": endpoint_id},
    )
    return True


async def rotate_secret(
    session: AsyncSession,
    endpoint_id: uuid.UUID,
    *,
    key_id: str,
    ciphertext: bytes,
    previous_key_id: str,
    previous_ciphertext: bytes,
    grace_s: float,
) -> EndpointRow:
    row = (
        await session.execute(
            text(
                f"""
                UPDATE webhook_endpoint SET key_id = :kid, secret_ciphertext = :blob,
                       previous_key_id = :pkid, previous_secret_ciphertext = :pblob,
                       previous_valid_until = now() + make_interval(secs => :grace)
                WHERE id = :id
                RETURNING {_ENDPOINT}
                """
            ),
            {
                "id": endpoint_id,
                "kid": key_id,
                "blob": ciphertext,
                "pkid": previous_key_id,
                "pblob": previous_ciphertext,
                "grace": grace_s,
            },
        )
    ).one()
    return EndpointRow(**row._mapping)
