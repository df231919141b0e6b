"""The operator's view of the outbox: pages and summaries of events, the dead letters, and the
one requeue (for the API and the CLI alike). Every function runs in the caller's session and never
commits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.outbox import COLUMNS, ENQUEUE, NOTIFY, OutboxRow


async def list_dead(session: AsyncSession, *, limit: int = 100) -> list[OutboxRow]:
    """Rows an operator may need to look at: `dead` and `failed`."""
    rows = await session.execute(
        text(
            f"SELECT {COLUMNS} FROM outbox_event WHERE status IN ('dead', 'failed') "
            "ORDER BY id LIMIT :lim"
        ),
        {"lim": limit},
    )
    return [OutboxRow(**r._mapping) for r in rows]


@dataclass(frozen=True)
class OutboxSummary:
    """An outbox row as operators see it: the payload stays in the database, only its `jobId`
    leaves (payloads may one day carry more than ids; an admin page must never echo them)."""

    id: int
    event_type: str
    aggregate_id: str
    status: str
    attempt_count: int
    available_at: datetime
    locked_by: str | None
    last_error: str | None
    published_at: datetime | None
    created_at: datetime
    job_id: str | None


_SUMMARY = (
    "id, event_type, aggregate_id, status, attempt_count, available_at, locked_by, last_error, "
    "published_at, created_at, payload->>'jobId' AS job_id"
)


# `pending` is requeueable too: a row backing off (available_at in the future) becomes
# available now, which also makes a repeated requeue harmless.
REQUEUEABLE = ("dead", "failed", "pending")


async def list_page(
    session: AsyncSession,
    *,
    status: str | None = None,
    event_type: str | None = None,
    before_id: int | None = None,
    limit: int = 20,
) -> list[OutboxSummary]:
    """Newest first, keyset on id (the primary key): a page never shifts under inserts, since
    new rows have larger ids than any cursor already handed out."""
    rows = await session.execute(
        text(
            f"""
            SELECT {_SUMMARY} FROM outbox_event
            WHERE (CAST(:status AS text) IS NULL OR status = CAST(:status AS text))
              AND (CAST(:etype AS text) IS NULL OR event_type = CAST(:etype AS text))
              AND (CAST(:before AS bigint) IS NULL OR id < CAST(:before AS bigint))
            ORDER BY id DESC
            LIMIT :lim
            """
        ),
        {"status": status, "etype": event_type, "before": before_id, "lim": limit},
    )
    return [OutboxSummary(**r._mapping) for r in rows]


async def get_summary(session: AsyncSession, event_id: int) -> OutboxSummary | None:
    row = (
        await session.execute(
            text(f"SELECT {_SUMMARY} FROM outbox_event WHERE id = :id"), {"id": event_id}
        )
    ).first()
    return OutboxSummary(**row._mapping) if row else None


async def requeue(session: AsyncSession, event_ids: Sequence[int]) -> list[OutboxSummary]:
    """The one operator requeue (the admin API for one row, `aijobs outbox --requeue` for all
    parked rows): each dead, failed or pending row goes (back) to `pending` with a fresh set of
    attempts, available now, and the relays are woken (NOTIFY, delivered at commit). Returns the
    rows it requeued, in id order; a missing or not requeueable id is left out (the caller tells
    which with `get_summary`).

    `last_error` is kept: it is why the row needed an operator, and the next failure overwrites
    it anyway. Races with a relay: a claim holds the row lock (`FOR UPDATE SKIP LOCKED`) until
    its transaction commits; this UPDATE then re-checks the status on the committed version,
    finds `processing` and changes nothing, so a row being dispatched is never reset under it.
    (The reconciler's `outbox.republish_enqueue` is not an operator's requeue: it sends a published
    enqueue whose workflow is missing out again, and never touches a parked row.)
    """
    if not event_ids:
        return []
    rows = (
        await session.execute(
            text(
                # _SUMMARY is a column list of this module; every value is a bind parameter.
                f"""
                UPDATE outbox_event SET status = 'pending', attempt_count = 0,
                       available_at = now(),
                       locked_by = NULL, locked_at = NULL
                WHERE id = ANY(:ids) AND status = ANY(:ok)
                RETURNING {_SUMMARY}
                """
            ),
            {"ids": list(event_ids), "ok": list(REQUEUEABLE)},
        )
    ).all()
    if not rows:
        return []
    await session.execute(NOTIFY)
    return sorted((OutboxSummary(**r._mapping) for r in rows), key=lambda r: r.id)


async def enqueue_row_for_job(session: AsyncSession, job_id: str) -> OutboxRow | None:
    """The job's `ai.job.enqueue` event (one per job, written in its create transaction)."""
    row = (
        await session.execute(
            text(
                f"""
                SELECT {COLUMNS} FROM outbox_event
                WHERE aggregate_id = :aid AND event_type = :etype
                ORDER BY id DESC LIMIT 1
                """
            ),
            {"aid": job_id, "etype": ENQUEUE},
        )
    ).first()
    return OutboxRow(**row._mapping) if row else None


async def for_aggregate(
    session: AsyncSession, aggregate_id: str, *, limit: int = 50
) -> list[OutboxSummary]:
    """One job's (or bulk operation's) events, oldest first: its enqueue and its ending, as the
    console's job page lists them (the `aggregate_id` index)."""
    rows = await session.execute(
        text(
            f"SELECT {_SUMMARY} FROM outbox_event WHERE aggregate_id = :aid ORDER BY id LIMIT :lim"
        ),
        {"aid": aggregate_id, "lim": limit},
    )
    return [OutboxSummary(**r._mapping) for r in rows]
