"""Result reuse on a real PostgreSQL, without Temporal: the `reuse` stage's one transaction
(jobs/reuse.py `step`) for each state of the source, the create's lookup (`candidate`, by user
first), and the trigger that NOTIFYs a source's end to the waker only when a queued job waits
on it. Rows are written through the repositories, states seeded by raw SQL (as test_schema's)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import psycopg
from sqlalchemy import text

from db import lifecycle as lifecycle_db
from db import reuse as reuse_db
from db.session import SessionMaker, libpq_url
from jobs import reuse
from tests.integration.engine_helpers import new_job

KEY = "k" * 64
OWNER = "ai-background:flashcard_generation:dependent"
ANSWER = {"flashcards": [{"front": "Q", "back": "A"}]}


async def job(sm: SessionMaker, user: str = "u1", **kw: Any) -> uuid.UUID:
    row = dataclasses.replace(new_job(user), reuse_key=KEY, **kw)
    async with sm.begin() as s:
        await lifecycle_db.create(s, row)
    return row.id


async def seed(sm: SessionMaker, job_id: uuid.UUID, sql: str, **params: Any) -> None:
    async with sm.begin() as s:
        await s.execute(text(f"UPDATE ai_job SET {sql} WHERE id = :id"), {"id": job_id, **params})


async def succeeded(sm: SessionMaker, user: str = "u1") -> uuid.UUID:
    src = await job(sm, user)
    await seed(sm, src, "lifecycle_status = 'running', status = 'processing'")
    await seed(
        sm,
        src,
        "lifecycle_status = 'succeeded', status = 'completed', output = CAST(:o AS jsonb), "
        "output_hash = :h",
        o='{"flashcards": [{"front": "Q", "back": "A"}]}',
        h="h" * 64,
    )
    return src


async def step(sm: SessionMaker, job_id: uuid.UUID) -> reuse.Step | None:
    async with sm.begin() as s:
        return await reuse.step(s, job_id, owner=OWNER, identity="t", ttl_s=60, run_id="r")


async def row(sm: SessionMaker, job_id: uuid.UUID) -> Any:
    async with sm() as s:
        return (await s.execute(text("SELECT * FROM ai_job WHERE id = :id"), {"id": job_id})).one()


async def test_a_succeeded_source_gives_its_answer_once_and_a_retry_finds_it(
    db: SessionMaker,
) -> None:
    src = await succeeded(db)
    me = await job(db, reused_from_job_id=src)
    assert await step(db, me) == reuse.Step("copied", output_hash="h" * 64)
    r = await row(db, me)
    assert (r.lifecycle_status, r.output, r.output_hash) == ("running", ANSWER, "h" * 64)
    assert r.locked_by.split("/")[0] == OWNER and r.progress == reuse.COPIED_PROGRESS
    # A retry after a commit whose answer was lost: the copy under its own lock.
    assert await step(db, me) == reuse.Step("copied", output_hash="h" * 64)


async def test_an_active_source_is_waited_for_unless_its_window_holds_it(
    db: SessionMaker,
) -> None:
    src = await job(db)
    me = await job(db, reused_from_job_id=src)
    # Queued and not yet dispatched: this job went first; waiting would never end.
    assert await step(db, me) == reuse.Step("run")
    assert (await row(db, me)).reused_from_job_id is None
    me = await job(db, reused_from_job_id=src)
    await seed(db, src, "dispatched_at = now()")
    assert await step(db, me) == reuse.Step("wait")
    await seed(db, src, "lifecycle_status = 'running', status = 'processing'")
    assert await step(db, me) == reuse.Step("wait")
    r = await row(db, me)
    assert (r.lifecycle_status, r.reused_from_job_id, r.locked_by) == ("queued", src, None)


async def test_a_source_without_an_answer_is_forgotten(db: SessionMaker) -> None:
    failed = await job(db)
    await seed(db, failed, "lifecycle_status = 'running', status = 'processing'")
    await seed(db, failed, "lifecycle_status = 'failed', status = 'failed'")
    purged = await succeeded(db)
    await seed(db, purged, "private_data_purged_at = now(), output = NULL")
    someone_elses = await succeeded(db, user="u2")
    for src in (failed, purged, someone_elses):
        me = await job(db, reused_from_job_id=src)
        assert await step(db, me) == reuse.Step("run"), src
        r = await row(db, me)
        assert (r.lifecycle_status, r.reused_from_job_id, r.output) == ("queued", None, None)


async def test_an_ended_job_is_reported_and_a_gone_one_is_none(db: SessionMaker) -> None:
    me = await job(db, reused_from_job_id=await succeeded(db))
    await seed(db, me, "lifecycle_status = 'cancelled', status = 'cancelled'")
    assert await step(db, me) == reuse.Step("ended", lifecycle_status="cancelled")
    assert await step(db, uuid.uuid4()) is None


async def test_the_lookup_is_the_users_own_newest_answer_or_active_root(db: SessionMaker) -> None:
    async def found(user: str) -> reuse_db.Candidate | None:
        async with db.begin() as s:
            return await reuse_db.candidate(s, user_id=user, job_type="synthetic", reuse_key=KEY)

    theirs = await succeeded(db, user="u2")
    assert await found("u1") is None
    assert (c := await found("u2")) is not None and c.id == theirs
    root = await job(db)
    waiter = await job(db, reused_from_job_id=root)
    c = await found("u1")
    assert c is not None and c.id == waiter and c.reused_from_job_id == root
    await seed(db, waiter, "cancel_requested_at = now()")  # a job asked to stop is no source
    await seed(db, root, "cancel_requested_at = now()")
    assert await found("u1") is None


async def test_a_source_end_is_notified_only_while_a_queued_job_waits_on_it(
    db: SessionMaker, database_url: str
) -> None:
    conn = await psycopg.AsyncConnection.connect(libpq_url(database_url), autocommit=True)
    async with conn:
        await conn.execute("LISTEN ai_reuse_source_ended")
        alone, waited = await job(db), await job(db)
        dependent = await job(db, reused_from_job_id=waited)
        for src in (alone, waited):
            await seed(db, src, "lifecycle_status = 'cancelled', status = 'cancelled'")
        heard = [n.payload async for n in conn.notifies(timeout=1.0)]
        assert heard == [str(waited)]
        async with db.begin() as s:
            assert await reuse_db.waiting_on(s, waited) == [(await row(db, dependent)).workflow_id]
        assert await reuse.stranded(db) == [(await row(db, dependent)).workflow_id]


async def test_waiters_on_a_failed_source_share_one_new_call(db: SessionMaker) -> None:
    root = await job(db)
    await seed(db, root, "lifecycle_status = 'running', status = 'processing'")
    first = await job(db, reused_from_job_id=root)
    second = await job(db, reused_from_job_id=root)
    for w in (first, second):
        await seed(db, w, "dispatched_at = now()")
    await seed(db, root, "lifecycle_status = 'failed', status = 'failed'")
    # The first to look makes its own call (the other one waits on the failed root: no source);
    # the second then waits on the first, and looks again soon (the move may race its end).
    assert await step(db, first) == reuse.Step("run")
    assert await step(db, second) == reuse.Step("wait", look_again=True)
    assert (await row(db, second)).reused_from_job_id == first
    await seed(db, first, "lifecycle_status = 'running', status = 'processing'")
    await seed(
        db,
        first,
        "lifecycle_status = 'succeeded', status = 'completed', output = CAST(:o AS jsonb), "
        "output_hash = :h",
        o='{"flashcards": [{"front": "Q", "back": "A"}]}',
        h="f" * 64,
    )
    assert await step(db, second) == reuse.Step("copied", output_hash="f" * 64)
