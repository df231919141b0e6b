"""A batch's results in `ai_batch_item`: each line's outcome recorded once, the jobs to tell, and
a batch that failed as a whole (db/models/batch.py).

An item's outcome is recorded once: `settle` moves only an item whose `ended_at` is null, so
the charge its caller writes in the same transaction is written once, whatever the retries.
Recording an outcome also ends the hold a job that left a closed batch keeps on its
reservation (db/budgets.py): the charge and the hold's end commit together.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from db.batches import FORM_OF_BODY


@dataclass(frozen=True)
class Settled:
    """An item whose outcome `settle` just recorded, with what its charge needs of its job."""

    item_id: uuid.UUID
    job_id: uuid.UUID
    attempt: int
    status: str
    user_id: str
    job_type: str
    credential_mode: str
    structured_output: str | None = None  # the form its line asked for


# The outcome of one line, once: only an item of this batch not yet ended moves. A cancelled
# item keeps its status and stores no answer (its job is gone, its content may be purged
# already), but what the provider billed for it is charged like the others' (the caller's
# usage row).
_SETTLE = text(
    f"""
    WITH moved AS (
        UPDATE ai_batch_item SET
            status = CASE WHEN status IN ('pending', 'submitted') THEN :status ELSE status END,
            response = CASE WHEN status IN ('pending', 'submitted') THEN :response END,
            error_code = :error_code, ended_at = now()
        WHERE batch_id = :batch_id AND custom_id = :custom_id AND ended_at IS NULL
        RETURNING id, job_id, attempt, status, body
    )
    SELECT moved.id, moved.job_id, moved.attempt, moved.status, j.user_id, j.job_type,
           j.credential_mode, {FORM_OF_BODY.format(b="moved.body")} AS form
    FROM moved JOIN ai_job j ON j.id = moved.job_id
    """
).bindparams(bindparam("response", type_=JSONB))


async def settle(
    session: AsyncSession,
    batch_id: uuid.UUID,
    custom_id: str,
    *,
    status: str,
    response: Mapping[str, Any] | None,
    error_code: str | None,
) -> Settled | None:
    """Record the outcome of the batch's line `custom_id` (`succeeded` with the chat
    completion, or `failed` with a code); None when it was recorded already, or names no item
    of this batch (nothing to charge)."""
    if status not in ("succeeded", "failed"):
        raise ValueError(f"not an item outcome: {status!r}")
    r = (
        await session.execute(
            _SETTLE,
            {
                "batch_id": batch_id,
                "custom_id": custom_id,
                "status": status,
                "response": None if response is None else dict(response),
                "error_code": error_code,
            },
        )
    ).first()
    if r is None:
        return None
    return Settled(
        r.id, r.job_id, r.attempt, r.status, r.user_id, r.job_type, r.credential_mode, r.form
    )


_TO_SIGNAL = text(
    "SELECT DISTINCT j.workflow_id FROM ai_batch_item i JOIN ai_job j ON j.id = i.job_id "
    "WHERE i.batch_id = :id AND i.status IN ('succeeded', 'failed') ORDER BY j.workflow_id"
)


async def workflows_to_signal(session: AsyncSession, batch_id: uuid.UUID) -> list[str]:
    """The job workflows of the batch's answered or failed items (not those that left)."""
    return [str(w) for w in (await session.execute(_TO_SIGNAL, {"id": batch_id})).scalars()]


_FAIL_LIVE = text(
    """
    UPDATE ai_batch_item SET status = 'failed', error_code = :code, ended_at = now()
    WHERE batch_id = :id AND status IN ('pending', 'submitted') AND ended_at IS NULL
    """
)
_END_CANCELLED = text(
    "UPDATE ai_batch_item SET ended_at = now() WHERE batch_id = :id AND ended_at IS NULL"
)


async def fail_items(session: AsyncSession, batch_id: uuid.UUID, code: str) -> None:
    """Every item of the batch still waiting fails with `code` (the batch failed, or its files
    named no outcome for them: each job retries in a later batch); the ones that left are
    closed, uncharged (no answer was billed for them), their jobs' holds ended."""
    await session.execute(_FAIL_LIVE, {"id": batch_id, "code": code})
    await session.execute(_END_CANCELLED, {"id": batch_id})
