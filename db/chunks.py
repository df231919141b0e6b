"""`ai_job_chunk`: a long source's chunks, one row each, written with the job at create.

A chunk is named by (job id, chunk number) and a character range of the job's input; its text
is cut from the snapshot when its call is made and never stored elsewhere, so Temporal and
logs see chunk numbers and counts only. Each chunk keeps its own attempts and, once it
succeeded, its validated output (private data under the retention rule, like `ai_job.output`).

Every function runs in the caller's transaction and never commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession


@dataclass(frozen=True)
class PlannedChunk:
    chunk_no: int
    start_char: int
    end_char: int
    input_tokens: int  # the chunk call's estimated prompt tokens
    item_count: int  # items this chunk is asked for


async def insert_plan(s: AsyncSession, job_id: uuid.UUID, chunks: Sequence[PlannedChunk]) -> None:
    """The job's chunk plan, in its create transaction."""
    if not chunks:
        return
    await s.execute(
        text(
            """
            INSERT INTO ai_job_chunk (job_id, chunk_no, start_char, end_char, input_tokens,
                item_count)
            VALUES (:job_id, :chunk_no, :start_char, :end_char, :input_tokens, :item_count)
            """
        ),
        [{"job_id": job_id, **c.__dict__} for c in chunks],
    )


# ---- reads: what a long source's readers see before (or instead of) its merged output -------


@dataclass(frozen=True)
class SucceededChunk:
    chunk_no: int
    output: dict[str, Any]
    finished_at: datetime | None


async def succeeded_chunks(
    s: AsyncSession, job_id: uuid.UUID, *, exclude: Sequence[int] = ()
) -> list[SucceededChunk]:
    """The job's succeeded chunks with their validated outputs, in chunk order, leaving out the
    chunk numbers in `exclude` (those a reader already has). A chunk's output is written with
    its 'succeeded' in one transaction, so a succeeded chunk always has one."""
    rows = await s.execute(
        text(
            """
            SELECT chunk_no, output, finished_at FROM ai_job_chunk
            WHERE job_id = :job_id AND status = 'succeeded' AND output IS NOT NULL
              AND NOT (chunk_no = ANY(:exclude))
            ORDER BY chunk_no
            """
        ),
        {"job_id": job_id, "exclude": list(exclude)},
    )
    return [SucceededChunk(r.chunk_no, dict(r.output), r.finished_at) for r in rows]


async def store_merged_output(
    s: AsyncSession, job_id: uuid.UUID, *, output: dict[str, Any], output_hash: str
) -> None:
    """The merged output of the chunks a job kept when it ended early (failed, cancelled,
    timed out), written in the transaction of that ending (`jobs/lifecycle.py`): the job's
    `output` is then what its artifacts were projected from. Not a lifecycle write."""
    await s.execute(
        text(
            "UPDATE ai_job SET output = :out, output_hash = :h, updated_at = now() WHERE id = :id"
        ).bindparams(bindparam("out", type_=JSONB)),
        {"id": job_id, "out": output, "h": output_hash},
    )


class ArtifactState(NamedTuple):
    """What the artifacts API asks of a job before it pages its parts."""

    status: str
    chunk_count: int | None
    purged: bool  # its private data is purged: no artifact shows content


async def job_chunking(s: AsyncSession, job_id: uuid.UUID) -> ArtifactState | None:
    """The job's lifecycle status, chunk count and whether its private data is purged; None
    when it does not exist: what the artifacts API asks before it decides between projected
    artifacts and chunk items, and whether any content may be shown."""
    row = (
        await s.execute(
            text(
                "SELECT lifecycle_status, chunk_count, "
                "private_data_purged_at IS NOT NULL AS purged FROM ai_job WHERE id = :id"
            ),
            {"id": job_id},
        )
    ).first()
    if row is None:
        return None
    return ArtifactState(str(row.lifecycle_status), row.chunk_count, bool(row.purged))


# ---- the fan-out: each chunk's call (EXECUTE), the merge (MERGE), an admin retry ------------


@dataclass(frozen=True)
class ChunkState:
    """What the workflow may know of a chunk: its number, status and attempts (no text)."""

    chunk_no: int
    status: str  # pending | running | succeeded | failed (its last attempt failed)
    attempt_count: int


@dataclass(frozen=True)
class ChunkRow:
    chunk_no: int
    start_char: int
    end_char: int
    input_tokens: int
    item_count: int
    status: str
    attempt_count: int
    output_hash: str | None
    # An answer kept while its moderation could not run (jobs/guardrails.py): private.
    held_answer: str | None = None

    def planned(self) -> PlannedChunk:
        return PlannedChunk(
            self.chunk_no, self.start_char, self.end_char, self.input_tokens, self.item_count
        )


# Also run pipelined on the driver connection by RESOLVE (db/pipeline.py).
CHUNK_STATES = text(
    "SELECT chunk_no, status, attempt_count FROM ai_job_chunk "
    "WHERE job_id = :job_id ORDER BY chunk_no"
)


async def get_for_update(s: AsyncSession, job_id: uuid.UUID, chunk_no: int) -> ChunkRow | None:
    """One chunk, its row locked until the caller's transaction ends: two attempts of one chunk
    (a retry racing a lost one) decide on its status one after the other."""
    row = (
        await s.execute(
            text(
                "SELECT chunk_no, start_char, end_char, input_tokens, item_count, status, "
                "attempt_count, output_hash, held_answer FROM ai_job_chunk "
                "WHERE job_id = :job_id AND chunk_no = :n FOR UPDATE"
            ),
            {"job_id": job_id, "n": chunk_no},
        )
    ).first()
    return ChunkRow(**row._mapping) if row else None


async def unfinished_input_tokens(s: AsyncSession, job_id: uuid.UUID) -> list[int]:
    """The estimated prompt tokens of each chunk not yet succeeded: the calls the job may still
    pay for (its reservation must hold their worst cases)."""
    rows = await s.execute(
        text(
            "SELECT input_tokens FROM ai_job_chunk "
            "WHERE job_id = :job_id AND status <> 'succeeded' ORDER BY chunk_no"
        ),
        {"job_id": job_id},
    )
    return [int(r.input_tokens) for r in rows]


async def start_attempt(s: AsyncSession, job_id: uuid.UUID, chunk_no: int, attempt: int) -> None:
    """The chunk is being called: `running`, its attempt counted (a gated attempt rolls this
    back with the rest of its first transaction, so only attempts that ran are counted)."""
    await s.execute(
        text(
            "UPDATE ai_job_chunk SET status = 'running', error_code = NULL, "
            "attempt_count = greatest(attempt_count, :a) "
            "WHERE job_id = :job_id AND chunk_no = :n AND status <> 'succeeded'"
        ),
        {"job_id": job_id, "n": chunk_no, "a": attempt},
    )


async def record_failure(
    s: AsyncSession, job_id: uuid.UUID, chunk_no: int, attempt: int, error_code: str
) -> None:
    """A failed attempt of the chunk: `failed` with its code (the next attempt, if Temporal
    retries it, makes it `running` again). A succeeded chunk is never touched."""
    await s.execute(
        text(
            "UPDATE ai_job_chunk SET status = 'failed', error_code = :c, "
            "attempt_count = greatest(attempt_count, :a) "
            "WHERE job_id = :job_id AND chunk_no = :n AND status <> 'succeeded'"
        ),
        {"job_id": job_id, "n": chunk_no, "a": attempt, "c": error_code},
    )


async def copy_succeeded(s: AsyncSession, *, from_job: uuid.UUID, to_job: uuid.UUID) -> int:
    """An admin retry keeps what the original paid for: when both jobs were planned with the
    same chunks (same numbers, ranges and items asked), the original's succeeded chunks are
    copied into the retry's rows (output, hash, `succeeded`), so the retry calls only for the
    others. Different plans (the settings changed in between) copy nothing. Returns how many
    chunks were copied."""
    plan = text(
        "SELECT chunk_no, start_char, end_char, item_count FROM ai_job_chunk "
        "WHERE job_id = :job_id ORDER BY chunk_no"
    )
    old = [tuple(r) for r in await s.execute(plan, {"job_id": from_job})]
    new = [tuple(r) for r in await s.execute(plan, {"job_id": to_job})]
    if not old or old != new:
        return 0
    result = await s.execute(
        text(
            """
            UPDATE ai_job_chunk n SET status = 'succeeded', output = o.output,
                output_hash = o.output_hash, finished_at = o.finished_at
            FROM ai_job_chunk o
            WHERE n.job_id = :to_job AND o.job_id = :from_job AND o.chunk_no = n.chunk_no
              AND o.status = 'succeeded' AND o.output IS NOT NULL
            """
        ),
        {"from_job": from_job, "to_job": to_job},
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
