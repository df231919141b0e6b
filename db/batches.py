"""`ai_batch` and `ai_batch_item`: the batch tier's rows (db/models/batch.py), read and written
by the job side (enroll, the item's outcome, leave) and by the batch workflow's activities
(close, submitted, each item's outcome, end).

Invariants, each kept by a compare-and-set in SQL rather than by the callers' order:
- One `open` batch per (provider, model, key, task queue) (a partial unique index); an item
  joins it under the batch row's lock, and the window's close (`open → submitting`) takes the
  same lock, so an item is either in the file that is uploaded or in the next batch. So does a
  job's leave: it sees the batch's state as the close left it.
- No batch holds more lines or JSONL bytes than its caps (`BatchCaps`): an enroll whose line
  would take the open batch past either closes it and opens the next, and a batch that reaches
  the line cap closes at once.
- One item per job attempt (`custom_id` `job-{job_id}-a{attempt}` is unique): a retried enroll
  finds its item again.
- An item's outcome is recorded once (`settle` moves only an item whose `ended_at` is null),
  so the charge written in the same transaction is written once, whatever the retries.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

BATCH_WORKFLOW_PREFIX = "ai-batch:"
ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
# An item whose job may still get an answer from its batch.
LIVE_ITEM = ("pending", "submitted")


def workflow_id_of(batch_id: uuid.UUID) -> str:
    return f"{BATCH_WORKFLOW_PREFIX}{batch_id}"


def custom_id_of(job_id: uuid.UUID, attempt: int, form: str | None = None) -> str:
    """A job attempt's line; `form`: its line again in a lower structured-output form (the
    first was refused for its form)."""
    return f"job-{job_id}-a{attempt}" + (f"-{form}" if form else "")


@dataclass(frozen=True)
class BatchCaps:
    """AI_BATCH_MAX_LINES and AI_BATCH_MAX_BYTES: the most lines, and JSONL bytes, one batch's
    file may hold."""

    max_lines: int = 10_000
    max_bytes: int = 100_000_000


@dataclass(frozen=True)
class ClosedBatch:
    """A batch an enroll closed at a cap: its workflow is poked to submit it now."""

    batch_id: uuid.UUID
    workflow_id: str


@dataclass(frozen=True)
class Enrolled:
    batch_id: uuid.UUID
    workflow_id: str
    custom_id: str
    item_id: uuid.UUID
    closed: tuple[ClosedBatch, ...] = ()  # batches this enroll closed (its own one included)


@dataclass(frozen=True)
class ItemRow:
    """One job attempt's item as the job side reads it once signalled."""

    id: uuid.UUID
    batch_id: uuid.UUID
    custom_id: str
    status: str
    response: dict[str, Any] | None
    error_code: str | None
    batch_status: str
    form: str = "json_object"  # the structured-output form its line asked for


@dataclass(frozen=True)
class Left:
    batch_id: uuid.UUID
    workflow_id: str
    batch_status: str
    all_cancelled: bool  # no item of the batch is live any more


@dataclass(frozen=True)
class BatchRow:
    id: uuid.UUID
    provider: str
    model: str
    key_ref: str
    task_queue: str
    status: str
    provider_batch_id: str | None
    input_file_id: str | None
    workflow_id: str
    item_count: int
    created_at: datetime
    submitted_at: datetime | None
    byte_count: int = 0
    upload_started_at: datetime | None = None


_FIND_ITEM = text(
    "SELECT i.id, i.batch_id, b.workflow_id FROM ai_batch_item i "
    "JOIN ai_batch b ON b.id = i.batch_id WHERE i.custom_id = :custom_id"
)
_NEW_BATCH = text(
    """
    INSERT INTO ai_batch (id, provider, model, key_ref, task_queue, workflow_id)
    VALUES (:id, :provider, :model, :key_ref, :task_queue, :workflow_id)
    ON CONFLICT (provider, model, key_ref, task_queue) WHERE status = 'open' DO NOTHING
    """
)
_OPEN_BATCH = text(
    "SELECT id, workflow_id, item_count, byte_count FROM ai_batch WHERE provider = :provider "
    "AND model = :model AND key_ref = :key_ref AND task_queue = :task_queue "
    "AND status = 'open' FOR UPDATE"
)
_NEW_ITEM = text(
    "INSERT INTO ai_batch_item (id, batch_id, job_id, attempt, custom_id, body, line_bytes) "
    "VALUES (:id, :batch_id, :job_id, :attempt, :custom_id, :body, :line_bytes)"
).bindparams(bindparam("body", type_=JSONB))
# The item counted; a batch that reached the line cap closes in the same statement.
_COUNT = text(
    """
    UPDATE ai_batch SET item_count = item_count + 1, byte_count = byte_count + :line_bytes,
        status = CASE WHEN item_count + 1 >= :max_lines THEN 'submitting' ELSE status END
    WHERE id = :id RETURNING status
    """
)
_CLOSE_FULL = text("UPDATE ai_batch SET status = 'submitting' WHERE id = :id AND status = 'open'")


async def enroll(
    session: AsyncSession,
    *,
    job_id: uuid.UUID,
    attempt: int,
    provider: str,
    model: str,
    key_ref: str,
    task_queue: str,
    body: Mapping[str, Any],
    line_bytes: int,
    caps: BatchCaps | None = None,
    again_as: str | None = None,
) -> Enrolled:
    """The job attempt's item, `pending` in its group's open batch (a new batch when none is
    open, or when its line would take the open one past a cap: that one is closed). Idempotent:
    the attempt's item, if it exists, is returned as it is. `line_bytes` is the size of its
    line as it will be uploaded (providers/batch_lines.py `encode_line`); the caller refuses a
    line larger than a whole batch may be (`caps.max_bytes`) before. `again_as`: the attempt's
    line once more, in that lower structured-output form (an item of its own)."""
    caps = caps or BatchCaps()
    custom_id = custom_id_of(job_id, attempt, again_as)
    found = (await session.execute(_FIND_ITEM, {"custom_id": custom_id})).first()
    if found is not None:
        return Enrolled(found.batch_id, found.workflow_id, custom_id, found.id)
    group = {"provider": provider, "model": model, "key_ref": key_ref, "task_queue": task_queue}
    closed: list[ClosedBatch] = []
    while True:
        new_id = uuid.uuid4()
        await session.execute(
            _NEW_BATCH, {"id": new_id, "workflow_id": workflow_id_of(new_id), **group}
        )
        # Waits for a close in progress; a batch it closed no longer matches: try again.
        batch = (await session.execute(_OPEN_BATCH, group)).first()
        if batch is None:
            continue
        full = batch.item_count + 1 > caps.max_lines or batch.byte_count + line_bytes > (
            caps.max_bytes
        )
        if batch.item_count == 0 or not full:
            break
        # This line would take the batch past a cap: it goes as it is, the line opens the next.
        await session.execute(_CLOSE_FULL, {"id": batch.id})
        closed.append(ClosedBatch(batch.id, batch.workflow_id))
    item_id = uuid.uuid4()
    await session.execute(
        _NEW_ITEM,
        {
            "id": item_id,
            "batch_id": batch.id,
            "job_id": job_id,
            "attempt": attempt,
            "custom_id": custom_id,
            "body": dict(body),
            "line_bytes": line_bytes,
        },
    )
    counted = {"id": batch.id, "line_bytes": line_bytes, "max_lines": caps.max_lines}
    if (await session.execute(_COUNT, counted)).scalar_one() == "submitting":
        closed.append(ClosedBatch(batch.id, batch.workflow_id))
    return Enrolled(batch.id, batch.workflow_id, custom_id, item_id, tuple(closed))


# The form a line asked for, as its body says (providers/structured.py `form_of_body`).
FORM_OF_BODY = (
    "CASE WHEN {b}->'response_format' IS NULL THEN 'none' "
    "WHEN {b}->'response_format'->>'type' = 'json_schema' THEN 'json_schema' "
    "ELSE 'json_object' END"
)
# The attempt's latest item (a line refused for its form is followed by one in a lower form).
_ITEM_FOR = text(
    "SELECT i.id, i.batch_id, i.custom_id, i.status, i.response, i.error_code, "
    f"b.status AS batch_status, {FORM_OF_BODY.format(b='i.body')} AS form "
    "FROM ai_batch_item i JOIN ai_batch b ON b.id = i.batch_id "
    "WHERE i.job_id = :job_id AND i.attempt = :attempt ORDER BY i.created_at DESC LIMIT 1"
)


async def item_for(session: AsyncSession, job_id: uuid.UUID, attempt: int) -> ItemRow | None:
    r = (await session.execute(_ITEM_FOR, {"job_id": job_id, "attempt": attempt})).first()
    if r is None:
        return None
    return ItemRow(
        r.id, r.batch_id, r.custom_id, r.status, r.response, r.error_code, r.batch_status, r.form
    )


# A pending item of a batch still open leaves for good (nothing of it will be sent). Once the
# batch is closed (uploading, or submitted), its line may be answered and billed: the item stays
# to have its outcome recorded and charged (`ended_at` null), and until then it holds its job's
# reservation open (db/budgets.py). The batch row is locked first, as the close locks it, so
# the batch's state the leave acts on is the one the close left (never a file that holds the
# line while the item thinks it left for good).
_LEAVE = text(
    """
    WITH b AS (
        SELECT id, status, workflow_id FROM ai_batch
        WHERE id IN (SELECT batch_id FROM ai_batch_item
                     WHERE job_id = :job_id AND status IN ('pending', 'submitted'))
        FOR UPDATE
    )
    UPDATE ai_batch_item i SET status = 'cancelled',
        ended_at = CASE WHEN b.status = 'open' THEN now() END
    FROM b
    WHERE b.id = i.batch_id AND i.job_id = :job_id AND i.status IN ('pending', 'submitted')
    RETURNING i.batch_id, b.workflow_id, b.status
    """
)
_LIVE = text(
    "SELECT count(*) FROM ai_batch_item WHERE batch_id = :id AND status IN ('pending', 'submitted')"
)


async def leave(session: AsyncSession, job_id: uuid.UUID) -> Left | None:
    """The job's live item `cancelled` (None: it has none), and whether its batch still has a
    live item (a batch without one is cancelled at the provider by its next poll)."""
    r = (await session.execute(_LEAVE, {"job_id": job_id})).first()
    if r is None:
        return None
    live = int((await session.execute(_LIVE, {"id": r.batch_id})).scalar_one())
    return Left(r.batch_id, r.workflow_id, r.status, live == 0)


_GET = text(
    "SELECT id, provider, model, key_ref, task_queue, status, provider_batch_id, "
    "input_file_id, workflow_id, item_count, created_at, submitted_at, byte_count, "
    "upload_started_at FROM ai_batch WHERE id = :id"
)


async def get(session: AsyncSession, batch_id: uuid.UUID) -> BatchRow | None:
    r = (await session.execute(_GET, {"id": batch_id})).first()
    return None if r is None else BatchRow(*r)


async def live_items(session: AsyncSession, batch_id: uuid.UUID) -> int:
    """How many items of the batch may still be answered for a job that waits."""
    return int((await session.execute(_LIVE, {"id": batch_id})).scalar_one())


_CLOSE = text(
    "UPDATE ai_batch SET status = 'submitting' WHERE id = :id AND status = 'open' RETURNING id"
)


async def close(session: AsyncSession, batch_id: uuid.UUID) -> BatchRow | None:
    """End the batch's window (`open → submitting`, under the lock an enroll and a leave take)
    and read it back. A batch closed already (at a cap, or by an earlier submit) is read as
    it is."""
    await session.execute(_CLOSE, {"id": batch_id})
    return await get(session, batch_id)


_SUBMITTED = text(
    """
    UPDATE ai_batch SET status = 'submitted', provider_batch_id = :provider_batch_id,
        input_file_id = :input_file_id, submitted_at = now()
    WHERE id = :id AND status = 'submitting'
    """
)
_ITEMS_SUBMITTED = text(
    "UPDATE ai_batch_item SET status = 'submitted' WHERE batch_id = :id AND status = 'pending'"
)


async def mark_submitted(
    session: AsyncSession, batch_id: uuid.UUID, *, provider_batch_id: str, input_file_id: str
) -> None:
    """The provider has the batch: it and its pending items are `submitted`. Takes the batch's
    row lock first, as a leave does."""
    params = {"id": batch_id, "provider_batch_id": provider_batch_id}
    await session.execute(_SUBMITTED, {**params, "input_file_id": input_file_id})
    await session.execute(_ITEMS_SUBMITTED, {"id": batch_id})


_END = text(
    """
    UPDATE ai_batch SET status = :status, ended_at = now(),
        output_file_id = coalesce(:output_file_id, output_file_id),
        error_file_id = coalesce(:error_file_id, error_file_id)
    WHERE id = :id AND status NOT IN ('completed', 'failed', 'expired', 'cancelled')
    """
)


async def end(
    session: AsyncSession,
    batch_id: uuid.UUID,
    status: str,
    *,
    output_file_id: str | None = None,
    error_file_id: str | None = None,
) -> None:
    """The batch ended (`completed`, `failed`, `expired`, `cancelled`); once only."""
    if status not in ENDED:
        raise ValueError(f"not an ended batch status: {status!r}")
    await session.execute(
        _END,
        {
            "id": batch_id,
            "status": status,
            "output_file_id": output_file_id,
            "error_file_id": error_file_id,
        },
    )
