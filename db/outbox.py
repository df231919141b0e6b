"""The transactional outbox (DESIGN §3, ADR §4).

Rows are inserted in the caller's transaction. Relays claim batches by compare-and-set
(`pending → processing` under `FOR UPDATE SKIP LOCKED`, so concurrent claimers never see the same
row), dispatch them outside any transaction, then mark them published or failed. A claimer that
dies leaves `processing` rows behind; `release_expired` puts them back after the lock TTL, so the
crash window costs latency, never a job. Starting a workflow twice is harmless (the workflow id is
the job's), which is what makes the at-least-once dispatch safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

ENQUEUE = "ai.job.enqueue"
COMPLETED = "ai.job.completed"
FAILED = "ai.job.failed"
CANCELLED = "ai.job.cancelled"
NOTIFY_CHANNEL = "ai_outbox"
MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class OutboxRow:
    id: int
    event_type: str
    aggregate_type: str
    aggregate_id: str
    dedupe_key: str
    payload: dict[str, Any]
    status: str
    attempt_count: int
    available_at: datetime
    locked_by: str | None
    locked_at: datetime | None
    last_error: str | None
    published_at: datetime | None
    created_at: datetime


_COLUMNS = (
    "id, event_type, aggregate_type, aggregate_id, dedupe_key, payload, status, attempt_count, "
    "available_at, locked_by, locked_at, last_error, published_at, created_at"
)

_INSERT = text(
    """
    INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,
                              status, attempt_count, available_at, created_at)
    VALUES (:event_type, :aggregate_type, :aggregate_id, :dedupe_key, :payload,
            'pending', 0, now(), now())
    ON CONFLICT (dedupe_key) DO NOTHING
    RETURNING id
    """
).bindparams(bindparam("payload", type_=JSONB))


class OutboxRepository:
    """Stateless; every method runs in the session it is given and never commits."""

    async def insert(
        self,
        session: AsyncSession,
        *,
        event_type: str,
        aggregate_type: str,
        aggregate_id: str,
        dedupe_key: str,
        payload: dict[str, Any],
        notify: bool = True,
    ) -> int | None:
        """Insert in the caller's transaction. A duplicate dedupe_key is an idempotent no-op
        (returns None). NOTIFY is transactional: relays are woken only if the row commits."""
        row = (
            await session.execute(
                _INSERT,
                {
                    "event_type": event_type,
                    "aggregate_type": aggregate_type,
                    "aggregate_id": aggregate_id,
                    "dedupe_key": dedupe_key,
                    "payload": payload,
                },
            )
        ).first()
        if row is not None and notify:
            await session.execute(text(f"NOTIFY {NOTIFY_CHANNEL}"))
        return int(row.id) if row else None

    async def claim_batch(
        self, session: AsyncSession, *, owner: str, limit: int
    ) -> list[OutboxRow]:
        rows = await session.execute(
            text(
                f"""
                WITH c AS (
                    SELECT id FROM outbox_event
                    WHERE status = 'pending' AND available_at <= now()
                    ORDER BY available_at, id
                    LIMIT :lim
                    FOR UPDATE SKIP LOCKED)
                UPDATE outbox_event o SET status = 'processing', locked_by = :owner,
                       locked_at = now(), attempt_count = o.attempt_count + 1
                FROM c WHERE o.id = c.id AND o.status = 'pending'
                RETURNING {", ".join("o." + c.strip() for c in _COLUMNS.split(","))}
                """
            ),
            {"lim": limit, "owner": owner},
        )
        return sorted((OutboxRow(**r._mapping) for r in rows), key=lambda r: r.id)

    async def mark_published(self, session: AsyncSession, ids: Sequence[int], *, owner: str) -> int:
        """Only the claimer's own `processing` rows: a row released and re-claimed by another
        relay meanwhile is that relay's to mark."""
        if not ids:
            return 0
        result = await session.execute(
            text(
                """
                UPDATE outbox_event SET status = 'published', published_at = now(),
                       locked_by = NULL, locked_at = NULL
                WHERE id = ANY(:ids) AND status = 'processing' AND locked_by = :owner
                """
            ),
            {"ids": list(ids), "owner": owner},
        )
        return int(result.rowcount)  # type: ignore[attr-defined]

    async def mark_failed(
        self,
        session: AsyncSession,
        event_id: int,
        *,
        owner: str,
        error: str,
        base_backoff_s: float = 1.0,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> str | None:
        """Back to pending with exponential backoff, or `dead` after `max_attempts` claims.
        Returns the new status (None if the row was no longer ours)."""
        row = (
            await session.execute(
                text(
                    """
                    UPDATE outbox_event SET
                        status = CASE WHEN attempt_count >= :max THEN 'dead' ELSE 'pending' END,
                        available_at = now() + make_interval(
                            secs => :base * power(2, greatest(attempt_count - 1, 0))),
                        last_error = left(:err, 2000), locked_by = NULL, locked_at = NULL
                    WHERE id = :id AND status = 'processing' AND locked_by = :owner
                    RETURNING status
                    """
                ),
                {
                    "id": event_id,
                    "owner": owner,
                    "err": error,
                    "base": base_backoff_s,
                    "max": max_attempts,
                },
            )
        ).first()
        return str(row.status) if row else None

    async def release_expired(self, session: AsyncSession, *, ttl_s: float) -> int:
        """`processing` rows whose claimer went silent for `ttl_s` go back to pending."""
        result = await session.execute(
            text(
                """
                UPDATE outbox_event SET status = 'pending', locked_by = NULL, locked_at = NULL
                WHERE status = 'processing' AND locked_at < now() - make_interval(secs => :ttl)
                """
            ),
            {"ttl": ttl_s},
        )
        return int(result.rowcount)  # type: ignore[attr-defined]

    async def list_dead(self, session: AsyncSession, *, limit: int = 100) -> list[OutboxRow]:
        rows = await session.execute(
            text(
                f"SELECT {_COLUMNS} FROM outbox_event WHERE status = 'dead' ORDER BY id LIMIT :lim"
            ),
            {"lim": limit},
        )
        return [OutboxRow(**r._mapping) for r in rows]

    async def requeue_dead(self, session: AsyncSession, ids: Sequence[int]) -> int:
        """Admin: give dead rows a fresh set of attempts."""
        result = await session.execute(
            text(
                """
                UPDATE outbox_event SET status = 'pending', attempt_count = 0,
                       available_at = now(), last_error = NULL
                WHERE id = ANY(:ids) AND status = 'dead'
                """
            ),
            {"ids": list(ids)},
        )
        if result.rowcount:  # type: ignore[attr-defined]
            await session.execute(text(f"NOTIFY {NOTIFY_CHANNEL}"))
        return int(result.rowcount)  # type: ignore[attr-defined]

    async def requeue_published(self, session: AsyncSession, event_id: int) -> bool:
        """Reconciler: a published enqueue whose workflow does not exist goes out again."""
        result = await session.execute(
            text(
                """
                UPDATE outbox_event SET status = 'pending', available_at = now(),
                       published_at = NULL, attempt_count = 0
                WHERE id = :id AND status = 'published'
                """
            ),
            {"id": event_id},
        )
        if result.rowcount:  # type: ignore[attr-defined]
            await session.execute(text(f"NOTIFY {NOTIFY_CHANNEL}"))
        return bool(result.rowcount)  # type: ignore[attr-defined]
