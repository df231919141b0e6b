"""Bulk operations: the operation row, its frozen items and their one-way state.

An operation's jobs are chosen once, at submission (`freeze_items`: one INSERT ... SELECT with
the admin list's filter), so what a bulk action touches never depends on when its pages run.
Each item leaves `pending` exactly once (`settle` is a compare-and-set) in the transaction that
acts on its job. Repositories never commit.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from db.jobs import JobFilter, filter_sql

PENDING, DONE, SKIPPED, FAILED = "pending", "done", "skipped", "failed"
# A bulk retry the owner's quotas or budgets refused (its reason: the refusal's code): no job
# was created, and the item is never counted as done.
REFUSED = "refused"
RUNNING, COMPLETED = "running", "completed"
# The outbox event that starts an operation's workflow (the relay dispatches it), written in the
# submission's transaction: an accepted operation always gets its workflow.
BULK_START = "ai.bulk.start"


def start_dedupe_key(operation_id: uuid.UUID) -> str:
    return f"{BULK_START}:{operation_id}"


@dataclass(frozen=True)
class OperationRow:
    id: uuid.UUID
    action: str
    actor: str
    filter: dict[str, Any]
    status: str
    matched: int
    idempotency_key: str | None
    workflow_id: str
    workflow_started_at: datetime | None
    created_at: datetime
    finished_at: datetime | None
    # A bulk retry that creates its retries past the owners' quotas and budgets.
    override_budget: bool = False


@dataclass(frozen=True)
class Item:
    ordinal: int
    job_id: uuid.UUID


_OP_COLUMNS = (
    "id, action, actor, filter, status, matched, idempotency_key, workflow_id, "
    "workflow_started_at, created_at, finished_at, override_budget"
)


async def count_matching(session: AsyncSession, f: JobFilter) -> int:
    where, params = filter_sql(f)
    return int(
        (
            await session.execute(
                text(f"SELECT count(*) FROM ai_job WHERE {' AND '.join(where)}"), params
            )
        ).scalar_one()
    )


async def sample(session: AsyncSession, f: JobFilter, limit: int) -> list[uuid.UUID]:
    """The first `limit` matching jobs in the order a bulk operation would take them."""
    where, params = filter_sql(f)
    rows = await session.execute(
        text(
            f"SELECT id FROM ai_job WHERE {' AND '.join(where)} ORDER BY created_at, id LIMIT :lim"
        ),
        {**params, "lim": limit},
    )
    return [r.id for r in rows]


async def insert_operation(
    session: AsyncSession,
    *,
    operation_id: uuid.UUID,
    action: str,
    actor: str,
    filter_json: dict[str, Any],
    idempotency_key: str | None,
    workflow_id: str,
    override_budget: bool = False,
) -> None:
    await session.execute(
        text(
            """
            INSERT INTO bulk_operation (id, action, actor, filter, matched, idempotency_key,
                                        workflow_id, override_budget)
            VALUES (:id, :action, :actor, :filter, 0, :key, :wid, :override)
            """
        ).bindparams(bindparam("filter", type_=JSONB)),
        {
            "id": operation_id,
            "action": action,
            "actor": actor,
            "filter": filter_json,
            "key": idempotency_key,
            "wid": workflow_id,
            "override": override_budget,
        },
    )


async def freeze_items(
    session: AsyncSession, operation_id: uuid.UUID, f: JobFilter, limit: int
) -> int:
    """Write one pending item per matching job (at most `limit`), numbered 1.. in (created_at,
    id) order, and record their number as the operation's `matched`; returns it."""
    where, params = filter_sql(f)
    result = await session.execute(
        text(
            f"""
            INSERT INTO bulk_operation_item (operation_id, ordinal, job_id)
            SELECT :op, row_number() OVER (ORDER BY created_at, id), id
            FROM (SELECT id, created_at FROM ai_job WHERE {" AND ".join(where)}
                  ORDER BY created_at, id LIMIT :lim) m
            """
        ),
        {**params, "op": operation_id, "lim": limit},
    )
    matched = int(result.rowcount)  # type: ignore[attr-defined]
    await session.execute(
        text("UPDATE bulk_operation SET matched = :n WHERE id = :op"),
        {"n": matched, "op": operation_id},
    )
    return matched


async def get(session: AsyncSession, operation_id: uuid.UUID) -> OperationRow | None:
    row = (
        await session.execute(
            text(f"SELECT {_OP_COLUMNS} FROM bulk_operation WHERE id = :id"),
            {"id": operation_id},
        )
    ).first()
    return OperationRow(**row._mapping) if row else None


async def find_by_key(session: AsyncSession, actor: str, key: str) -> OperationRow | None:
    row = (
        await session.execute(
            text(
                f"SELECT {_OP_COLUMNS} FROM bulk_operation "
                "WHERE actor = :actor AND idempotency_key = :key"
            ),
            {"actor": actor, "key": key},
        )
    ).first()
    return OperationRow(**row._mapping) if row else None


async def mark_workflow_started(session: AsyncSession, operation_id: uuid.UUID) -> None:
    await session.execute(
        text(
            "UPDATE bulk_operation SET workflow_started_at = coalesce(workflow_started_at, now()) "
            "WHERE id = :id"
        ),
        {"id": operation_id},
    )


async def counts(session: AsyncSession, operation_id: uuid.UUID) -> dict[tuple[str, str], int]:
    """Items per (state, reason); reason '' when there is none."""
    rows = await session.execute(
        text(
            """
            SELECT state, coalesce(reason, '') AS reason, count(*) AS n
            FROM bulk_operation_item WHERE operation_id = :op GROUP BY state, reason
            """
        ),
        {"op": operation_id},
    )
    return {(r.state, r.reason): int(r.n) for r in rows}


async def pending_page(
    session: AsyncSession, operation_id: uuid.UUID, *, after: int, limit: int
) -> list[Item]:
    rows = await session.execute(
        text(
            """
            SELECT ordinal, job_id FROM bulk_operation_item
            WHERE operation_id = :op AND state = 'pending' AND ordinal > :after
            ORDER BY ordinal LIMIT :lim
            """
        ),
        {"op": operation_id, "after": after, "lim": limit},
    )
    return [Item(r.ordinal, r.job_id) for r in rows]


async def settle(
    session: AsyncSession,
    operation_id: uuid.UUID,
    ordinal: int,
    state: str,
    *,
    reason: str | None = None,
    result_job_id: uuid.UUID | None = None,
) -> bool:
    """CAS pending → `state`; False when the item already left `pending` (an earlier attempt
    acted on it): the caller must then roll its action back."""
    result = await session.execute(
        text(
            """
            UPDATE bulk_operation_item
            SET state = :state, reason = :reason, result_job_id = :rj, updated_at = now()
            WHERE operation_id = :op AND ordinal = :ord AND state = 'pending'
            """
        ),
        {
            "op": operation_id,
            "ord": ordinal,
            "state": state,
            "reason": reason,
            "rj": result_job_id,
        },
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def complete(session: AsyncSession, operation_id: uuid.UUID) -> bool:
    """running → completed; False when it already was (a retried finish)."""
    result = await session.execute(
        text(
            "UPDATE bulk_operation SET status = 'completed', finished_at = now() "
            "WHERE id = :id AND status = 'running'"
        ),
        {"id": operation_id},
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]
