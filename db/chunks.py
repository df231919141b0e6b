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

from sqlalchemy import text
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
