"""PROJECT with a planned projector (every built-in job type's), on a real PostgreSQL: the read,
then the business rows, the artifacts, `succeeded` with its `ai.job.completed` and the usage
summary in one pipelined batch, then COMMIT, on one pooled connection (`db/pipeline.py`
`Transaction`). What must hold is what held when it ran on a session: all or nothing, a cancel
racing it wins cleanly, and a duplicate run writes nothing new."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError
from temporalio.testing import ActivityEnvironment

from activities.stages import JobActivities
from db import jobs as jobs_db
from db import pipeline
from db.lifecycle import LOCK_STATE
from db.outbox import CANCELLED, COMPLETED
from db.session import SessionMaker
from engine.contracts import ExecuteInput, ProjectInput, ProjectResult, StageInput
from engine.settings import Settings
from jobs import lifecycle
from jobs.lifecycle import DUPLICATE_PROJECTION_LOG
from jobs.service import CreateJobRequest, JobService
from jobs.types import default_catalog
from runtime.wiring import create_policy, engine_config, gateway
from tests.integration.engine_helpers import insert_job, job_facts, scalar
from tests.support import eventually

PROGRESS = text("UPDATE ai_job SET progress = :p WHERE id = :id")


async def _executed(
    db: SessionMaker, settings: Settings
) -> tuple[JobActivities, ActivityEnvironment, uuid.UUID, str]:
    """A synthetic job taken through PREPARE, RESOLVE and EXECUTE: running, its output stored,
    locked by its workflow id; the activities, an environment for its workflow, the job id and
    the output's hash."""
    catalog = default_catalog()
    svc = JobService(db, catalog, create_policy(settings))
    job = (
        await svc.create(
            CreateJobRequest(
                user_id="u-planned",
                job_type="synthetic",
                target_type="lesson",
                target_id="L-1",
                input={"echo": {"k": 1}},
                internal=True,
            )
        )
    ).job
    acts = JobActivities(db, catalog, gateway(settings), engine_config(settings))
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        workflow_id=job.workflow_id,
        workflow_type="synthetic",
        attempt=1,
        heartbeat_timeout=None,
    )
    jid = str(job.id)
    await env.run(acts.prepare, StageInput(jid, job.workflow_id))
    await env.run(acts.resolve, StageInput(jid, job.workflow_id))
    ex = await env.run(acts.execute, ExecuteInput(jid, 30_000, "retry"))
    assert ex.output_hash
    return acts, env, job.id, ex.output_hash


async def test_a_planned_projection_ends_the_job_with_everything_it_wrote(
    db: SessionMaker, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    acts, env, job_id, digest = await _executed(db, settings)
    result = await env.run(acts.project, ProjectInput(str(job_id), digest))
    assert result.lifecycle_status == "succeeded" and result.artifact_count == 1
    assert result.summarized and result.calls == 1
    f = await job_facts(db, job_id)
    assert len(f.artifacts) == 1 and f.synthetic_results == [(f.artifacts[0][1], digest)]
    assert f.events.get(COMPLETED) == 1
    async with db() as s:
        row = await jobs_db.get(s, job_id)
    assert row is not None and row.lifecycle_status == "succeeded" and row.progress == 100

    # Again (a retry whose first answer was lost): the same answer, nothing new written, and
    # the repeat logged as the specification marks it.
    with caplog.at_level(logging.INFO, logger="jobs.lifecycle"):
        again = await env.run(acts.project, ProjectInput(str(job_id), digest))
    assert again == ProjectResult("succeeded", 1)
    assert await job_facts(db, job_id) == f
    (rec,) = [r for r in caplog.records if r.getMessage() == DUPLICATE_PROJECTION_LOG]
    assert rec.job_id == str(job_id)  # type: ignore[attr-defined]


async def test_a_cancel_racing_the_projection_wins_and_nothing_is_written(
    db: SessionMaker, settings: Settings
) -> None:
    """The job's row is locked while PROJECT runs, and cancelled before the lock goes: PROJECT's
    compare-and-set then matches no row, its business row, artifact and event are rolled back,
    and it reports the job cancelled."""
    acts, env, job_id, digest = await _executed(db, settings)
    async with db.begin() as s:
        await s.execute(text("SELECT id FROM ai_job WHERE id = :id FOR UPDATE"), {"id": job_id})
        projecting = asyncio.ensure_future(env.run(acts.project, ProjectInput(str(job_id), digest)))
        await eventually(
            lambda: scalar(db, "SELECT count(*) FROM pg_locks WHERE NOT granted"),
            timeout=15,
            what="PROJECT to wait on the job's row",
        )
        assert not projecting.done()
        assert await lifecycle.cancel(s, job_id) == "running"
    result = await asyncio.wait_for(projecting, 15)
    assert result == ProjectResult("cancelled", 0)
    f = await job_facts(db, job_id)
    assert f.artifacts == [] and f.synthetic_results == []
    assert COMPLETED not in f.events and f.events.get(CANCELLED) == 1


async def test_two_planned_projections_at_once_write_once(
    db: SessionMaker, settings: Settings
) -> None:
    """Two PROJECTs of the same output (a local-activity retry after a timeout) held at the
    job's row, then let go together: one ends the job, the other writes nothing and reports
    the job succeeded."""
    acts, env, job_id, digest = await _executed(db, settings)
    async with db.begin() as s:
        await s.execute(text("SELECT id FROM ai_job WHERE id = :id FOR UPDATE"), {"id": job_id})
        both = [
            asyncio.ensure_future(env.run(acts.project, ProjectInput(str(job_id), digest)))
            for _ in range(2)
        ]
        await eventually(
            lambda: scalar(db, "SELECT count(*) >= 2 FROM pg_locks WHERE NOT granted"),
            timeout=15,
            what="both PROJECTs to wait",
        )
    results = await asyncio.wait_for(asyncio.gather(*both), 15)
    # The winner reports the usage it summed; the other found the job ended.
    assert sorted(r.summarized for r in results) == [False, True]
    assert all(r.lifecycle_status == "succeeded" and r.artifact_count == 1 for r in results)
    f = await job_facts(db, job_id)
    assert len(f.artifacts) == 1 and len(f.synthetic_results) == 1
    assert f.events.get(COMPLETED) == 1


# ---- the transaction itself ----------------------------------------------------------------


async def _progress(db: SessionMaker, job_id: uuid.UUID) -> int:
    return int(await scalar(db, "SELECT progress FROM ai_job WHERE id = :id", id=job_id))


async def test_a_transaction_of_several_batches_commits_them_together(db: SessionMaker) -> None:
    job_id = await insert_job(db)
    async with pipeline.transaction(db) as tx:
        [state] = await tx.run([(LOCK_STATE, {"id": job_id})])
        assert state == [{"lifecycle_status": "queued", "locked_by": None}]
        await tx.run([(PROGRESS, {"p": 10, "id": job_id})])
        # Not visible outside before the COMMIT.
        assert await _progress(db, job_id) == 0
        await tx.run([(PROGRESS, {"p": 20, "id": job_id})], commit=True)
        with pytest.raises(RuntimeError):
            await tx.run([(PROGRESS, {"p": 30, "id": job_id})])
    assert await _progress(db, job_id) == 20


async def test_a_transaction_not_committed_is_rolled_back(db: SessionMaker) -> None:
    job_id = await insert_job(db)
    async with pipeline.transaction(db) as tx:
        await tx.run([(PROGRESS, {"p": 10, "id": job_id})])
    assert await _progress(db, job_id) == 0
    with pytest.raises(ValueError):
        async with pipeline.transaction(db) as tx:
            await tx.run([(PROGRESS, {"p": 11, "id": job_id})])
            raise ValueError("the caller gave up")
    assert await _progress(db, job_id) == 0


async def test_an_error_in_a_later_batch_rolls_back_the_earlier_ones(db: SessionMaker) -> None:
    job_id = await insert_job(db)
    dup = text(
        "INSERT INTO ai_job_artifact (job_id, artifact_type, artifact_id, ordinal, created_at) "
        "VALUES (:j, 't', 'a', 0, now())"
    )
    with pytest.raises(IntegrityError) as caught:
        async with pipeline.transaction(db) as tx:
            await tx.run([(PROGRESS, {"p": 10, "id": job_id}), (dup, {"j": job_id})])
            await tx.run([(dup, {"j": job_id})], commit=True)
    assert caught.value.params is None  # parameters hidden, as SQLAlchemy hides them
    assert await _progress(db, job_id) == 0
    assert await scalar(db, "SELECT count(*) FROM ai_job_artifact WHERE job_id = :j", j=job_id) == 0
    # The pooled connections are back as the sessions expect them.
    for _ in range(3):
        async with db.begin() as s:
            await s.execute(PROGRESS, {"p": 5, "id": job_id})
    assert await _progress(db, job_id) == 5


async def test_a_connection_that_dies_mid_transaction_leaves_the_pool(db: SessionMaker) -> None:
    job_id = await insert_job(db)
    engine: Any = db().bind  # the AsyncEngine the sessions are bound to
    before = engine.pool.checkedout()
    with pytest.raises(DBAPIError) as err:
        async with pipeline.transaction(db) as tx:
            await tx.run([(PROGRESS, {"p": 7, "id": job_id})])
            await tx.run([(text("SELECT pg_terminate_backend(pg_backend_pid())"), {})])
    assert err.value.connection_invalidated
    assert engine.pool.checkedout() == before
    assert await _progress(db, job_id) == 0
    for _ in range(3):
        [rows] = await pipeline.run(db, [(LOCK_STATE, {"id": job_id})], commit=False)
        assert rows


async def test_a_transaction_cancelled_mid_batch_writes_nothing_and_returns_its_connection(
    db: SessionMaker,
) -> None:
    """The task running a batch is cancelled while PostgreSQL still runs it (a stage cancelled
    by its workflow, a worker shutting down): the transaction is not committed, the connection
    goes back to the pool (or is dropped) and the pool's next sessions still run in
    transactions. (A batch that carries its COMMIT is, once sent, as undecided as any COMMIT
    whose answer never came back.)"""
    job_id = await insert_job(db)
    engine: Any = db().bind  # the AsyncEngine the sessions are bound to
    before = engine.pool.checkedout()
    started = asyncio.Event()

    async def slow() -> None:
        async with pipeline.transaction(db) as tx:
            started.set()
            await tx.run([(PROGRESS, {"p": 9, "id": job_id}), (text("SELECT pg_sleep(0.5)"), {})])
            await tx.commit()  # never reached

    task = asyncio.ensure_future(slow())
    await started.wait()
    await eventually(
        lambda: scalar(
            db, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'"
        ),
        timeout=10,
        what="the batch to be running",
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.pool.checkedout() == before
    assert await _progress(db, job_id) == 0
    async with db() as s:  # a session's rolled back write stays unwritten: not autocommit
        await s.execute(PROGRESS, {"p": 5, "id": job_id})
        await s.rollback()
    assert await _progress(db, job_id) == 0
