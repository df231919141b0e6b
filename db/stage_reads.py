"""The job stages' hot reads: PREPARE's, RESOLVE's and COMPLETE's, each one round trip.

Each is a few statements whose parameters are known before the first one runs, so each goes as
BEGIN, the reads, ROLLBACK in one pipeline on a pooled connection (db/pipeline.py `run`), not
as a session's BEGIN, one round trip per statement and ROLLBACK. The statements are the
repositories' own (db/lifecycle.py, db/jobs.py, db/chunks.py, db/usage.py), so each query has
one form; the results come back typed. A read writes nothing, so each function opens and ends
its own transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from db import pipeline
from db.chunks import CHUNK_STATES, ChunkState
from db.jobs import RESOLVE_REFS, ResolveRefs
from db.lifecycle import PREPARE_STATE, lock_state_of
from db.session import SessionMaker
from db.usage import SUMMARY, UsageSummary, summary_of


@dataclass(frozen=True)
class LockState:
    """A job's lifecycle status and the token of whoever holds its lock (None: nobody), and its
    start-by time and deadline (flow control; None: none)."""

    status: str
    locked_by: str | None
    expires_at: datetime | None = None
    deadline_at: datetime | None = None


@dataclass(frozen=True)
class ResolveRead:
    """What RESOLVE reads: the job's references (None: it is gone) and its chunks in chunk
    order (numbers and counts only, none for a one-call job: the ranges stay in SQL)."""

    refs: ResolveRefs | None
    chunks: list[ChunkState]


async def prepare_read(sm: SessionMaker, job_id: uuid.UUID) -> tuple[LockState | None, ResolveRead]:
    """PREPARE's read with RESOLVE's in the same round trip: the job's state, and what
    `resolve_read` reads (RESOLVE takes it through `activities/stage_handoff.py`)."""
    state, refs, chunks = await pipeline.run(
        sm,
        [
            (PREPARE_STATE, {"id": job_id}),
            (RESOLVE_REFS, {"id": job_id}),
            (CHUNK_STATES, {"job_id": job_id}),
        ],
        commit=False,
    )
    return _lock_state(state), _resolve_read(refs, chunks)


def _lock_state(rows: list[dict[str, Any]]) -> LockState | None:
    if not rows:
        return None
    r = rows[0]
    return LockState(*lock_state_of(r), r["expires_at"], r["deadline_at"])


def _resolve_read(refs: list[dict[str, Any]], chunks: list[dict[str, Any]]) -> ResolveRead:
    return ResolveRead(
        ResolveRefs(**refs[0]) if refs else None,
        [ChunkState(r["chunk_no"], r["status"], r["attempt_count"]) for r in chunks],
    )


async def resolve_read(sm: SessionMaker, job_id: uuid.UUID) -> ResolveRead:
    """RESOLVE's read: the job's references and its chunks, both in one round trip."""
    refs, chunks = await pipeline.run(
        sm, [(RESOLVE_REFS, {"id": job_id}), (CHUNK_STATES, {"job_id": job_id})], commit=False
    )
    return _resolve_read(refs, chunks)


async def usage_summary(sm: SessionMaker, job_id: uuid.UUID) -> UsageSummary:
    """COMPLETE's read: the job's usage (every call of every attempt, as ai_usage_log holds
    it)."""
    [rows] = await pipeline.run(sm, [(SUMMARY, {"id": job_id})], commit=False)
    return summary_of(rows[0])
