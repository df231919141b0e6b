"""`ai_batch_file`: the files at the provider that belong to a batch (its input, output and error
files, and an upload no batch uses), until each is deleted there (db/models/batch.py).

A file is due for deletion (`due`) when it can no longer be needed:
- an orphan (an upload no batch uses) at once;
- any other once no item of its batch is live (no job still waits for an answer from it) and
  either the batch ended (its results are stored: the output and error files were read) or
  every job it holds lines of was purged (its results will never be wanted; a file that still
  holds a live item of another job waits for that batch's results).
A failed delete is tried again later (`next_try_at`, backing off to an hour).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

INPUT, OUTPUT, ERROR, ORPHAN = "input", "output", "error", "orphan"
# A failed delete waits this long times 2^(failures - 1), at most an hour.
RETRY_BASE_S = 30
RETRY_MAX_S = 3600


@dataclass(frozen=True)
class DueFile:
    batch_id: uuid.UUID
    file_id: str
    provider: str
    key_ref: str


_RECORD = text(
    "INSERT INTO ai_batch_file (batch_id, file_id, role) VALUES (:batch_id, :file_id, :role) "
    "ON CONFLICT (batch_id, file_id) DO NOTHING"
)


async def record(
    session: AsyncSession, batch_id: uuid.UUID, files: Iterable[tuple[str, str]]
) -> None:
    """Files of the batch, as (file id, role); one recorded already is left as it is."""
    for file_id, role in files:
        params = {"batch_id": batch_id, "file_id": file_id, "role": role}
        await session.execute(_RECORD, params)


_DUE = text(
    """
    SELECT f.batch_id, f.file_id, b.provider, b.key_ref
    FROM ai_batch_file f JOIN ai_batch b ON b.id = f.batch_id
    WHERE f.deleted_at IS NULL AND f.next_try_at <= now()
      AND (CAST(:batch_id AS uuid) IS NULL OR f.batch_id = CAST(:batch_id AS uuid))
      AND (f.role = 'orphan' OR (
            NOT EXISTS (SELECT 1 FROM ai_batch_item i WHERE i.batch_id = f.batch_id
                        AND i.status IN ('pending', 'submitted'))
            AND (b.status IN ('completed', 'failed', 'expired', 'cancelled')
                 OR NOT EXISTS (SELECT 1 FROM ai_batch_item i JOIN ai_job j ON j.id = i.job_id
                                WHERE i.batch_id = f.batch_id
                                  AND j.private_data_purged_at IS NULL))))
    ORDER BY f.next_try_at LIMIT :lim
    """
)


async def due(
    session: AsyncSession, *, batch_id: uuid.UUID | None = None, limit: int = 100
) -> list[DueFile]:
    """Files due for deletion (module docstring), oldest try first; `batch_id`: that batch's
    only."""
    rows = await session.execute(_DUE, {"batch_id": batch_id, "lim": limit})
    return [DueFile(r.batch_id, r.file_id, r.provider, r.key_ref) for r in rows]


_DELETED = text(
    "UPDATE ai_batch_file SET deleted_at = now() "
    "WHERE batch_id = :batch_id AND file_id = :file_id AND deleted_at IS NULL"
)
_FAILED = text(
    """
    UPDATE ai_batch_file SET delete_attempts = delete_attempts + 1,
        next_try_at = now() + make_interval(secs => least(
            :base * power(2, least(delete_attempts, 20)), :most))
    WHERE batch_id = :batch_id AND file_id = :file_id AND deleted_at IS NULL
    """
)


async def deleted(session: AsyncSession, batch_id: uuid.UUID, file_id: str) -> None:
    """The file is gone at the provider (deleted, or it answered 404)."""
    await session.execute(_DELETED, {"batch_id": batch_id, "file_id": file_id})


async def delete_failed(session: AsyncSession, batch_id: uuid.UUID, file_id: str) -> None:
    """Its delete failed: tried again later, backing off."""
    params = {"batch_id": batch_id, "file_id": file_id}
    await session.execute(_FAILED, {**params, "base": RETRY_BASE_S, "most": RETRY_MAX_S})
