"""A batch's upload, as the submit makes it (db/models/batch.py): the start that fixes which
lines its file holds, the file read back line by line to be streamed to the provider, and the
input file's id recorded before the batch is created over it.

The file's lines are the batch's items whose outcome is not recorded yet (`ended_at` null) at
the upload's start: its live items and the items of jobs that left after the close (their lines
may still be sent, and answered). The first start ends the items of jobs that left before it
(nothing of them was sent: their jobs' holds end uncharged). From then on no item joins (the
batch is closed) and none ends before the results, so every attempt's file holds the same
lines, except a purged job's, whose content is gone: its line is left out (and never answered).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.batches import BatchRow, get


@dataclass(frozen=True)
class Upload:
    """The batch as its upload's start found it (locked): `first` when no earlier attempt
    began an upload (so nothing of it can be at the provider yet)."""

    batch: BatchRow
    first: bool
    started_at: datetime | None


@dataclass(frozen=True)
class FileLine:
    custom_id: str
    body: dict[str, Any]
    line_bytes: int


_LOCK = text("SELECT id FROM ai_batch WHERE id = :id FOR UPDATE")
_END_LEFT = text(
    "UPDATE ai_batch_item SET ended_at = now() "
    "WHERE batch_id = :id AND status = 'cancelled' AND ended_at IS NULL"
)
_STARTED = text(
    "UPDATE ai_batch SET upload_started_at = now() "
    "WHERE id = :id AND upload_started_at IS NULL RETURNING upload_started_at"
)


async def start_upload(session: AsyncSession, batch_id: uuid.UUID) -> Upload | None:
    """Under the batch's row lock (as a leave takes it): on the first start, the items of jobs
    that left end and the start is recorded. A batch not `submitting` is returned as it is."""
    await session.execute(_LOCK, {"id": batch_id})
    row = await get(session, batch_id)
    if row is None:
        return None
    if row.status != "submitting" or row.upload_started_at is not None:
        return Upload(row, first=False, started_at=row.upload_started_at)
    await session.execute(_END_LEFT, {"id": batch_id})
    started = (await session.execute(_STARTED, {"id": batch_id})).scalar_one()
    return Upload(row, first=True, started_at=started)


_IN_FILE = "batch_id = :id AND ended_at IS NULL AND body <> '{}'::jsonb"
_SNAPSHOT = text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
_SIZE = text(
    "SELECT count(*), coalesce(sum(line_bytes), 0), count(*) FILTER (WHERE line_bytes = 0) "
    f"FROM ai_batch_item WHERE {_IN_FILE}"
)
_LINES = text(
    f"SELECT custom_id, body, line_bytes FROM ai_batch_item WHERE {_IN_FILE} ORDER BY custom_id"
)


@dataclass(frozen=True)
class FileSize:
    """The lines of a batch's file and their bytes as counted at enroll; `unsized` lines were
    enrolled before sizes were counted (0: their bytes must be measured)."""

    lines: int
    bytes: int
    unsized: int


async def file_size(session: AsyncSession, batch_id: uuid.UUID) -> FileSize:
    """The lines and bytes of the batch's file. The first statement of its transaction: it
    makes the transaction one snapshot, so `file_lines` in it reads exactly what was counted."""
    await session.execute(_SNAPSHOT)
    count, size, unsized = (await session.execute(_SIZE, {"id": batch_id})).one()
    return FileSize(int(count), int(size), int(unsized))


async def file_lines(session: AsyncSession, batch_id: uuid.UUID) -> AsyncIterator[FileLine]:
    """The file's lines in custom id order, read through a server-side cursor (a page at a
    time, never the whole file), in the transaction `file_size` began."""
    rows = await session.stream(_LINES, {"id": batch_id}, execution_options={"yield_per": 200})
    async for r in rows:
        yield FileLine(r.custom_id, r.body, int(r.line_bytes))


_INPUT = text(
    "UPDATE ai_batch SET input_file_id = :file_id WHERE id = :id AND input_file_id IS NULL"
)


async def set_input_file(session: AsyncSession, batch_id: uuid.UUID, file_id: str) -> None:
    """The batch's input file, recorded before the batch is created over it (a retried submit
    then knows a create may have been sent)."""
    await session.execute(_INPUT, {"id": batch_id, "file_id": file_id})
