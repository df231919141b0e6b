"""`ai_batch` and `ai_batch_item`: the batch tier's rows (db/models/batch.py), read and written
by the job side (enroll, the item's outcome, leave) and by the batch workflow's activities
(close, submitted, each item's outcome, end).

Invariants, each kept by a compare-and-set in SQL rather than by the callers' order:
- One `open` batch per (provider, model, key, task queue) (a partial unique index); an item
  joins it under the batch row's lock, and the window's close (`open → submitting`) takes the
  same lock, so an item is either in the file that is uploaded or in the next batch.
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
class Enrolled:
    batch_id: uuid.UUID
    workflow_id: str
    custom_id: str
    item_id: uuid.UUID


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


@dataclass(frozen=True)
class PendingItem:
    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True)
class OpenItem:
    """An item of a submitted batch whose outcome is not recorded yet."""

    id: uuid.UUID
    custom_id: str
    status: str


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
    "SELECT id, workflow_id FROM ai_batch WHERE provider = :provider AND model = :model "
    "AND key_ref = :key_ref AND task_queue = :task_queue AND status = 'open' FOR UPDATE"
)
_NEW_ITEM = text(
    "INSERT INTO ai_batch_item (id, batch_id, job_id, attempt, custom_id, body) "
    "VALUES (:id, :batch_id, :job_id, :attempt, :custom_id, :body)"
).bindparams(bindparam("body", type_=JSONB))
_COUNT = text("UPDATE ai_batch SET item_count = item_count + 1 WHERE id = :id")


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
    again_as: str | None = None,
) -> Enrolled:
    """The job attempt's item, `pending` in its group's open batch (a new batch when none is
    open). Idempotent: the attempt's item, if it exists, is returned as it is. `again_as`: the
    attempt's line once more, in that lower structured-output form (its own item)."""
    custom_id = custom_id_of(job_id, attempt, again_as)
    found = (await session.execute(_FIND_ITEM, {"custom_id": custom_id})).first()
    if found is not None:
        return Enrolled(found.batch_id, found.workflow_id, custom_id, found.id)
    group = {"provider": provider, "model": model, "key_ref": key_ref, "task_queue": task_queue}
    while True:
        new_id = uuid.uuid4()
        await session.execute(
            _NEW_BATCH, {"id": new_id, "workflow_id": workflow_id_of(new_id), **group}
        )
        # Waits for a close in progress; a batch it closed no longer matches: try again.
        batch = (await session.execute(_OPEN_BATCH, group)).first()
        if batch is not None:
            break
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
        },
    )
    await session.execute(_COUNT, {"id": batch.id})
    return Enrolled(batch.id, batch.workflow_id, custom_id, item_id)


# The form a line asked for, as its body says (providers/structured.py `form_of_body`).
_FORM_OF_BODY = (
    "CASE WHEN i.body->'response_format' IS NULL THEN 'none' "
    "WHEN i.body->'response_format'->>'type' = 'json_schema' THEN 'json_schema' "
    "ELSE 'json_object' END"
)
# The attempt's latest item (a line refused for its form is followed by one in a lower form).
_ITEM_FOR = text(
    "SELECT i.id, i.batch_id, i.custom_id, i.status, i.response, i.error_code, "
    f"b.status AS batch_status, {_FORM_OF_BODY} AS form "
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


# A pending item leaves for good (its batch was not uploaded: nothing will come back); a
# submitted one (or one whose batch is uploading) may still be answered and billed, so its
# outcome stays to be recorded and charged.
_LEAVE = text(
    """
    UPDATE ai_batch_item i SET status = 'cancelled',
        ended_at = CASE WHEN b.status = 'open' THEN now() END
    FROM ai_batch b
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
    "input_file_id, workflow_id, item_count, created_at, submitted_at FROM ai_batch "
    "WHERE id = :id"
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
_PENDING = text(
    "SELECT custom_id, body FROM ai_batch_item WHERE batch_id = :id AND status = 'pending' "
    "ORDER BY created_at, custom_id"
)


async def close(session: AsyncSession, batch_id: uuid.UUID) -> tuple[str, list[PendingItem]]:
    """End the batch's window (`open → submitting`, under the lock an enroll takes) and read
    the items to upload. A batch already `submitting` (a retried submit) is read again; any
    other state is returned with no item."""
    await session.execute(_CLOSE, {"id": batch_id})
    row = await get(session, batch_id)
    if row is None:
        return "missing", []
    if row.status != "submitting":
        return row.status, []
    rows = (await session.execute(_PENDING, {"id": batch_id})).all()
    return row.status, [PendingItem(r.custom_id, r.body) for r in rows]


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
    """The provider has the batch: it and its pending items are `submitted`."""
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


_OPEN_ITEMS = text(
    "SELECT id, custom_id, status FROM ai_batch_item WHERE batch_id = :id "
    "AND ended_at IS NULL AND status IN ('pending', 'submitted', 'cancelled') "
    "ORDER BY custom_id"
)


async def open_items(session: AsyncSession, batch_id: uuid.UUID) -> list[OpenItem]:
    """The batch's items whose outcome is not recorded yet (a cancelled one included: the
    provider may have answered it, and billed it)."""
    rows = (await session.execute(_OPEN_ITEMS, {"id": batch_id})).all()
    return [OpenItem(r.id, r.custom_id, r.status) for r in rows]


# The outcome of one item, once: only an item not yet ended moves. A cancelled item keeps its
# status and stores no answer (its job is gone, its content may be purged already), but what
# the provider billed for it is charged like the others' (the caller's usage row).
_SETTLE = text(
    """
    WITH moved AS (
        UPDATE ai_batch_item SET
            status = CASE WHEN status IN ('pending', 'submitted') THEN :status ELSE status END,
            response = CASE WHEN status IN ('pending', 'submitted') THEN :response END,
            error_code = :error_code, ended_at = now()
        WHERE id = :id AND ended_at IS NULL
        RETURNING job_id, attempt, status, body
    )
    SELECT moved.job_id, moved.attempt, moved.status, j.user_id, j.job_type, j.credential_mode,
           CASE WHEN moved.body->'response_format' IS NULL THEN 'none'
                WHEN moved.body->'response_format'->>'type' = 'json_schema' THEN 'json_schema'
                ELSE 'json_object' END AS form
    FROM moved JOIN ai_job j ON j.id = moved.job_id
    """
).bindparams(bindparam("response", type_=JSONB))


async def settle(
    session: AsyncSession,
    item_id: uuid.UUID,
    *,
    status: str,
    response: Mapping[str, Any] | None,
    error_code: str | None,
) -> Settled | None:
    """Record an item's outcome (`succeeded` with the chat completion, or `failed` with a
    code); None when it was already recorded (nothing to charge again)."""
    if status not in ("succeeded", "failed"):
        raise ValueError(f"not an item outcome: {status!r}")
    r = (
        await session.execute(
            _SETTLE,
            {
                "id": item_id,
                "status": status,
                "response": None if response is None else dict(response),
                "error_code": error_code,
            },
        )
    ).first()
    if r is None:
        return None
    return Settled(
        item_id, r.job_id, r.attempt, r.status, r.user_id, r.job_type, r.credential_mode, r.form
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
    """Every item of the batch still waiting fails with `code` (the batch itself failed:
    each job retries in a later batch); the ones that left are closed."""
    await session.execute(_FAIL_LIVE, {"id": batch_id, "code": code})
    await session.execute(_END_CANCELLED, {"id": batch_id})
