"""EXECUTE's merged statements on a real PostgreSQL, sent as EXECUTE sends them (db/attempts.py,
through the transport): `GET_WITH_SNAPSHOT` reads the job and its unexpired snapshot in one
SELECT; `SETTLE_ATTEMPT` does in one UPDATE what
`record_attempt`, `extend_lock` and `store_output` did in that order: the attempt is always
recorded, the lock extended and the output stored only for the owner of a running job, and
the output not stored when a cancel was requested."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db import pipeline
from db import snapshots as snapshots_db
from db.jobs import JobRow
from db.session import SessionMaker
from tests.integration.engine_helpers import insert_job

TTL = 60
OUT = {"answer": 42}


async def _running(sm: SessionMaker, owner: str = "wf-1") -> uuid.UUID:
    job_id = await insert_job(sm)
    async with sm.begin() as s:
        await lifecycle_db.lock(s, job_id, owner=owner, identity="w1", ttl_s=1)
    return job_id


async def _row(sm: SessionMaker, job_id: uuid.UUID) -> JobRow:
    async with sm() as s:
        row = await jobs_db.get(s, job_id)
    assert row is not None
    return row


async def _settle(sm: SessionMaker, job_id: uuid.UUID, owner: str) -> tuple[bool, bool]:
    """The job's statement of db/attempts.py `settle`, committed on its own (a missing job has
    no usage row to go with it)."""
    params = lifecycle_db.settle_attempt_params(
        job_id, owner=owner, attempt=2, ttl_s=TTL, output=OUT, output_hash="h1", progress=60
    )
    [rows] = await pipeline.run(sm, [(lifecycle_db.SETTLE_ATTEMPT, params)], commit=True)
    return lifecycle_db.settled(rows[0] if rows else None)


async def _with_snapshot(
    s: AsyncSession, job_id: uuid.UUID
) -> tuple[JobRow, dict[str, Any] | None] | None:
    """db/attempts.py `take`'s read, pipelined in the session's transaction as `take` sends it
    (without the CAS before it)."""
    [rows] = await pipeline.in_session(s, [(jobs_db.GET_WITH_SNAPSHOT, {"id": job_id})])
    return jobs_db.with_snapshot_of(rows[0] if rows else None)


def _lock_until(row: JobRow) -> datetime:
    assert row.lock_until is not None
    return row.lock_until


async def test_the_owner_stores_extends_and_records(db: SessionMaker) -> None:
    job_id = await _running(db)
    async with db.begin() as s:
        await lifecycle_db.record_attempt(
            s, job_id, attempt=1, internal_error="x", correction_hint="fix it"
        )
    before = await _row(db, job_id)
    assert await _settle(db, job_id, "wf-1") == (True, False)
    row = await _row(db, job_id)
    assert row.output == OUT and row.output_hash == "h1" and row.progress == 60
    assert row.attempt_count == 2 and row.correction_hint is None
    assert row.internal_error_message == "x"  # kept, as record_attempt(internal_error=None) did
    assert _lock_until(row) > _lock_until(before)  # TTL 1 s -> 60 s


async def test_another_owner_records_the_attempt_only(db: SessionMaker) -> None:
    job_id = await _running(db, owner="wf-1")
    before = await _row(db, job_id)
    assert await _settle(db, job_id, "wf-2") == (False, False)
    row = await _row(db, job_id)
    assert row.output is None and row.output_hash is None
    assert row.attempt_count == 2
    assert row.lock_until == before.lock_until and row.locked_by == before.locked_by


async def test_a_requested_cancel_stores_nothing(db: SessionMaker) -> None:
    job_id = await _running(db)
    async with db.begin() as s:
        await lifecycle_db.request_cancel(s, job_id)
    assert await _settle(db, job_id, "wf-1") == (True, True)
    row = await _row(db, job_id)
    assert row.output is None and row.output_hash is None and row.progress < 60
    assert row.attempt_count == 2


async def test_a_queued_job_is_not_owned(db: SessionMaker) -> None:
    job_id = await insert_job(db)
    assert await _settle(db, job_id, "wf-1") == (False, False)
    assert (await _row(db, job_id)).output is None


async def test_a_missing_job_is_not_owned(db: SessionMaker) -> None:
    assert await _settle(db, uuid.uuid4(), "wf-1") == (False, False)


async def test_the_job_and_its_unexpired_snapshot_in_one_read(db: SessionMaker) -> None:
    job_id = await insert_job(db)
    async with db() as s:
        assert await _with_snapshot(s, uuid.uuid4()) is None
        found = await _with_snapshot(s, job_id)
    assert found is not None and found[0].id == job_id and found[1] is None
    async with db.begin() as s:
        await snapshots_db.insert_snapshot(
            s, job_id, {"text": "t"}, redaction_version="1", ttl_days=1
        )
    async with db() as s:
        found = await _with_snapshot(s, job_id)
    assert found is not None and found[1] == {"text": "t"}
    async with db.begin() as s:
        await s.execute(
            text(
                "UPDATE ai_job_snapshot SET expires_at = now() - interval '1 s' WHERE job_id = :j"
            ),
            {"j": job_id},
        )
    async with db() as s:
        found = await _with_snapshot(s, job_id)
    assert found is not None and found[1] is None
