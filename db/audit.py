"""The admin audit log: one row per admin action or view of internals.

Entries are written in the caller's transaction (the action's own, so an action and its entry
commit or roll back together) and never commit here. `detail` carries ids, filters and counts
only: never job input, output, prompts, keys or error texts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession


@dataclass(frozen=True)
class AuditRow:
    id: int
    actor: str
    action: str
    target_type: str
    target_id: str | None
    detail: dict[str, Any]
    outcome: str
    created_at: datetime


_COLUMNS = "id, actor, action, target_type, target_id, detail, outcome, created_at"
_INSERT = text(
    "INSERT INTO admin_audit (actor, action, target_type, target_id, detail, outcome) "
    "VALUES (:actor, :action, :tt, :tid, :detail, :outcome)"
).bindparams(bindparam("detail", type_=JSONB))


async def insert(
    session: AsyncSession,
    *,
    actor: str,
    action: str,
    target_type: str,
    target_id: str | None,
    outcome: str,
    detail: dict[str, Any] | None = None,
) -> None:
    await session.execute(
        _INSERT,
        {
            "actor": actor[:128],
            "action": action[:64],
            "tt": target_type[:32],
            "tid": target_id[:128] if target_id is not None else None,
            "detail": detail or {},
            "outcome": outcome[:64],
        },
    )


async def list_page(
    session: AsyncSession,
    *,
    actor: str | None = None,
    action: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> list[AuditRow]:
    """Newest first (descending id: ids grow with commits closely enough for a log, and a
    keyset on id is stable under inserts); `since` inclusive, `until` exclusive."""
    rows = await session.execute(
        text(
            f"""
            SELECT {_COLUMNS} FROM admin_audit
            WHERE (CAST(:actor AS text) IS NULL OR actor = CAST(:actor AS text))
              AND (CAST(:action AS text) IS NULL OR action = CAST(:action AS text))
              AND (CAST(:since AS timestamptz) IS NULL OR created_at >= :since)
              AND (CAST(:until AS timestamptz) IS NULL OR created_at < :until)
              AND (CAST(:before AS bigint) IS NULL OR id < :before)
            ORDER BY id DESC LIMIT :lim
            """
        ),
        {
            "actor": actor,
            "action": action,
            "since": since,
            "until": until,
            "before": before_id,
            "lim": limit,
        },
    )
    return [AuditRow(**r._mapping) for r in rows]


async def purge_older_than(session: AsyncSession, *, days: int, limit: int = 1000) -> int:
    """Delete at most `limit` entries written more than `days` ago, oldest first: one bounded
    batch (the reconciler's retention phase calls it once per pass)."""
    result = await session.execute(
        text(
            """
            DELETE FROM admin_audit WHERE id IN (
                SELECT id FROM admin_audit
                WHERE created_at < now() - make_interval(days => :d)
                ORDER BY created_at LIMIT :lim)
            """
        ),
        {"d": days, "lim": limit},
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
