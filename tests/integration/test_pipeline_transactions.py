"""`db/pipeline.py` on a real PostgreSQL: BEGIN, the statements and COMMIT or ROLLBACK in one
round trip, as one transaction: a read ends in ROLLBACK (it writes nothing), a write commits all
of its statements or none of them, a driver error comes out as SQLAlchemy raises it, and the
pooled connection goes back as the sessions expect it (no transaction open, not autocommit)."""

from __future__ import annotations

import socket
import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.pool import QueuePool

from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db import pipeline
from db.errors import is_driver_error, is_unavailable, is_unique_violation
from db.lifecycle import LOCK_STATE, SETTLE_ATTEMPT, settle_attempt_params, settled
from db.session import SessionMaker
from db.usage import SUMMARY, summary_of
from tests.integration.engine_helpers import insert_job

PROGRESS = text("UPDATE ai_job SET progress = :p WHERE id = :id")
DUPLICATE = text(
    "INSERT INTO ai_job_artifact (job_id, artifact_type, artifact_id, ordinal, created_at) "
    "VALUES (:j, 't', 'a', 0, now())"
)


async def _progress(sm: SessionMaker, job_id: uuid.UUID) -> int:
    async with sm() as s:
        row = await jobs_db.get(s, job_id)
    assert row is not None
    return row.progress


async def test_a_read_returns_rows_per_statement(db: SessionMaker) -> None:
    job_id = await insert_job(db)
    state, usage, none = await pipeline.run(
        db,
        [
            (LOCK_STATE, {"id": job_id}),
            (SUMMARY, {"id": job_id}),
            (PROGRESS, {"p": 0, "id": job_id}),
        ],
        commit=False,
    )
    assert state == [{"lifecycle_status": "queued", "locked_by": None}]
    assert summary_of(usage[0]).calls == 0
    assert none == []


async def test_a_read_rolls_back_what_it_wrote(db: SessionMaker) -> None:
    job_id = await insert_job(db)
    await pipeline.run(db, [(PROGRESS, {"p": 33, "id": job_id})], commit=False)
    assert await _progress(db, job_id) == 0


async def test_a_write_commits_every_statement(db: SessionMaker) -> None:
    job_id = await insert_job(db)
    async with db.begin() as s:
        await lifecycle_db.lock(s, job_id, owner="wf-1", identity="w1", ttl_s=60)
    params = settle_attempt_params(
        job_id,
        owner="wf-1",
        attempt=1,
        ttl_s=60,
        output={"a": [1, "x"]},
        output_hash="h",
        progress=60,
    )
    results = await pipeline.run(db, [(SETTLE_ATTEMPT, params)], commit=True)
    assert settled(results[0][0]) == (True, False)
    async with db() as s:
        row = await jobs_db.get(s, job_id)
    assert row is not None and row.output == {"a": [1, "x"]} and row.output_hash == "h"
    assert row.progress == 60


async def test_an_error_rolls_back_the_whole_transaction(db: SessionMaker) -> None:
    job_id = await insert_job(db)
    await pipeline.run(db, [(DUPLICATE, {"j": job_id})], commit=True)
    with pytest.raises(IntegrityError) as caught:
        await pipeline.run(
            db, [(PROGRESS, {"p": 44, "id": job_id}), (DUPLICATE, {"j": job_id})], commit=True
        )
    assert await _progress(db, job_id) == 0  # the first statement did not commit either
    exc = caught.value
    assert is_driver_error(exc) and is_unique_violation(exc) and not is_unavailable(exc)
    assert str(job_id) not in str(exc.statement or "") and exc.params is None


async def test_the_connection_goes_back_as_the_pool_expects(db: SessionMaker) -> None:
    job_id = await insert_job(db)
    with pytest.raises(DBAPIError):
        await pipeline.run(
            db, [(DUPLICATE, {"j": job_id}), (DUPLICATE, {"j": job_id})], commit=True
        )
    for _ in range(3):
        await pipeline.run(db, [(LOCK_STATE, {"id": job_id})], commit=False)
    # A session on the pool's connections still runs its own transaction: a rolled back write
    # stays unwritten, a committed one is there.
    async with db() as s:
        await s.execute(PROGRESS, {"p": 5, "id": job_id})
        await s.rollback()
    assert await _progress(db, job_id) == 0
    async with db.begin() as s:
        await s.execute(PROGRESS, {"p": 6, "id": job_id})
    assert await _progress(db, job_id) == 6


async def test_a_connection_that_dies_mid_pipeline_leaves_the_pool(db: SessionMaker) -> None:
    """The backend is killed between two statements of one pipelined transaction: the error is
    SQLAlchemy's, says the connection was invalidated and counts as the database being
    unavailable (the stages retry it), nothing of the transaction is written, and the pool's
    next connection works."""
    job_id = await insert_job(db)
    engine: Any = db().bind  # the AsyncEngine the sessions are bound to
    before = engine.pool.checkedout()
    with pytest.raises(DBAPIError) as err:
        await pipeline.run(
            db,
            [
                (PROGRESS, {"p": 7, "id": job_id}),
                (text("SELECT pg_terminate_backend(pg_backend_pid())"), {}),
                (PROGRESS, {"p": 8, "id": job_id}),
            ],
            commit=True,
        )
    assert err.value.connection_invalidated
    assert is_unavailable(err.value)
    assert engine.pool.checkedout() == before  # returned (and dropped), not leaked
    assert await _progress(db, job_id) == 0
    for _ in range(3):  # whichever pooled connection comes next is alive
        [rows] = await pipeline.run(db, [(LOCK_STATE, {"id": job_id})], commit=False)
        assert rows


async def test_in_session_runs_in_the_sessions_transaction(db: SessionMaker) -> None:
    job_id = await insert_job(db)
    async with db() as s:
        await s.execute(PROGRESS, {"p": 7, "id": job_id})
        state, none = await pipeline.in_session(
            s, [(LOCK_STATE, {"id": job_id}), (PROGRESS, {"p": 8, "id": job_id})]
        )
        assert state == [{"lifecycle_status": "queued", "locked_by": None}] and none == []
        await s.rollback()
    assert await _progress(db, job_id) == 0  # rolled back with the session
    async with db.begin() as s:
        await pipeline.in_session(s, [(PROGRESS, {"p": 9, "id": job_id})])
    assert await _progress(db, job_id) == 9  # committed with it


async def test_in_session_errors_abort_the_sessions_transaction(db: SessionMaker) -> None:
    job_id = await insert_job(db)
    await pipeline.run(db, [(DUPLICATE, {"j": job_id})], commit=True)
    with pytest.raises(IntegrityError):
        async with db.begin() as s:
            await s.execute(PROGRESS, {"p": 3, "id": job_id})
            await pipeline.in_session(s, [(DUPLICATE, {"j": job_id})])
    assert await _progress(db, job_id) == 0


async def test_a_database_that_cannot_be_reached_reads_as_unavailable() -> None:
    """The pool cannot open a connection (nothing listens on the port, as while PostgreSQL
    restarts): the error is SQLAlchemy's and counts as the database being unavailable, so a stage
    waits for it to come back instead of failing the attempt, and it says nothing of the
    statements."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    engine = create_async_engine(f"postgresql+psycopg://nobody@127.0.0.1:{port}/nothing")
    try:
        job_id = uuid.uuid4()
        with pytest.raises(DBAPIError) as err:
            await pipeline.run(
                async_sessionmaker(engine), [(PROGRESS, {"p": 1, "id": job_id})], commit=True
            )
        assert is_unavailable(err.value) and err.value.connection_invalidated
        pool = engine.sync_engine.pool
        assert isinstance(pool, QueuePool) and pool.checkedout() == 0  # none held
        assert str(job_id) not in str(err.value)
    finally:
        await engine.dispose()
