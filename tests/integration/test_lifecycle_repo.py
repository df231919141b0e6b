"""The lifecycle repository on a real PostgreSQL: the single writer of `lifecycle_status`,
compare-and-set transitions, the shadow write of the legacy `status`, the queued→running lock
with its owner, the heartbeat (`extend_lock`) and expired-lock discovery. Each call runs in a
transaction the test opens, as a use case would (the repository never opens its own)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db import endings as endings_db
from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db import reconciler as reconciler_db
from db.jobs import JobRow
from db.lifecycle import owner_token
from db.session import SessionMaker
from engine.errors import IllegalTransition, JobNotFound, LockConflict
from engine.lifecycle import LEGACY_STATUS, TERMINAL, LifecycleStatus, is_legal
from tests.integration.engine_helpers import insert_job, mark_succeeded

S = LifecycleStatus
T = TypeVar("T")
TTL = 60


async def in_tx(sm: SessionMaker, op: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """One repository call in a transaction of its own, committed when it returns."""
    async with sm.begin() as s:
        return await op(s)


async def get(sm: SessionMaker, job_id: uuid.UUID) -> JobRow:
    async with sm() as s:
        row = await jobs_db.get(s, job_id)
    assert row is not None
    return row


async def running_job(sm: SessionMaker, run_id: str = "run-1") -> uuid.UUID:
    job_id = await insert_job(sm)
    await in_tx(sm, lambda s: lifecycle_db.lock(s, job_id, owner=run_id, identity="w1", ttl_s=TTL))
    return job_id


# ---- property: random call sequences against the transition table --------------------------

RUNS = ("run-a", "run-b")
run_or_none = st.sampled_from((None, *RUNS))
OPS = st.one_of(
    st.tuples(st.just("lock"), st.sampled_from(RUNS)),
    st.tuples(st.just("extend"), st.sampled_from(RUNS)),
    st.tuples(st.just("succeed"), run_or_none),
    st.tuples(st.just("fail"), run_or_none, st.sampled_from((None, "boom", "crash"))),
    st.tuples(st.just("cancel")),
    st.tuples(st.just("cancel_if_queued")),
    st.tuples(st.just("request_cancel")),
    st.tuples(st.just("note"), st.sampled_from(("attempt 1 failed", "attempt 2 failed"))),
)


@dataclass
class Model:
    """What the table says the row must look like."""

    status: S = S.QUEUED
    owner: str | None = None  # run id holding the lock
    cancel_requested: bool = False
    error_code: str | None = None
    public: str | None = None
    internal: str | None = None
    log: list[Any] = field(default_factory=list)


def check_invariants(row: JobRow, m: Model) -> None:
    assert row.lifecycle_status == m.status, m.log
    assert row.status == LEGACY_STATUS[m.status], m.log  # shadow write
    assert (row.finished_at is not None) == (m.status in TERMINAL), m.log
    assert (row.started_at is not None) == (m.owner is not None), m.log
    if m.status == S.RUNNING:
        assert row.lock_until is not None and row.locked_by is not None
        assert row.locked_by.split("/", 1)[0] == m.owner
    else:
        assert row.lock_until is None
    assert (row.cancel_requested_at is not None) == m.cancel_requested, m.log
    assert (row.error_code, row.public_error_message) == (m.error_code, m.public), m.log
    assert row.internal_error_message == m.internal, m.log


async def apply(sm: SessionMaker, job_id: uuid.UUID, op: Any, m: Model) -> None:
    """Run one op and check its result against the model; updates the model."""
    name = op[0]
    call: Awaitable[Any]
    before = await get(sm, job_id)
    m.log.append(op)

    async def expect_illegal(to: S, call: Any) -> None:
        with pytest.raises(IllegalTransition) as info:
            await call
        assert (info.value.from_status, info.value.to_status) == (m.status, to), m.log
        assert not is_legal(m.status, to) or name in ("cancel_if_queued",)
        assert await get(sm, job_id) == before, m.log  # row unchanged

    async def expect_lock_conflict(call: Any) -> None:
        with pytest.raises(LockConflict) as info:
            await call
        assert info.value.locked_by == before.locked_by, m.log
        assert await get(sm, job_id) == before, m.log

    if name == "lock":
        run = op[1]
        call = in_tx(sm, lambda s: lifecycle_db.lock(s, job_id, owner=run, identity="w", ttl_s=TTL))
        if m.status == S.QUEUED or (m.status == S.RUNNING and m.owner == run):
            locked = await call
            assert locked.reacquired is (m.status == S.RUNNING), m.log
            assert locked.locked_by == owner_token(run, "w")
            m.status, m.owner = S.RUNNING, run
        elif m.status == S.RUNNING:
            await expect_lock_conflict(call)
        else:
            await expect_illegal(S.RUNNING, call)
    elif name == "extend":
        run = op[1]
        res = await in_tx(
            sm, lambda s: lifecycle_db.extend_lock(s, job_id, owner=run, ttl_s=TTL * 2)
        )
        if m.status == S.RUNNING and m.owner == run:
            assert res.extended and res.cancel_requested is m.cancel_requested, m.log
            after = await get(sm, job_id)
            assert before.lock_until is not None and after.lock_until is not None
            assert after.lock_until > before.lock_until, m.log
        else:
            assert not res.extended and not res.cancel_requested, m.log
            assert await get(sm, job_id) == before, m.log
    elif name in ("succeed", "fail"):
        run = op[1]
        to = S.SUCCEEDED if name == "succeed" else S.FAILED
        if name == "succeed":
            call = in_tx(sm, lambda s: mark_succeeded(s, job_id, owner=run))
        else:
            call = in_tx(
                sm,
                lambda s: endings_db.mark_failed(
                    s, job_id, "PROVIDER_UNAVAILABLE", "public text", op[2], owner=run
                ),
            )
        if m.status == S.RUNNING and run is not None and run != m.owner:
            await expect_lock_conflict(call)
        elif m.status == S.RUNNING:
            await call
            m.status = to
            if name == "fail":
                m.error_code, m.public = "PROVIDER_UNAVAILABLE", "public text"
                m.internal = op[2] if op[2] is not None else m.internal
            else:
                assert (await get(sm, job_id)).progress == 100
        else:
            await expect_illegal(to, call)
    elif name in ("cancel", "cancel_if_queued"):
        allowed = (S.QUEUED, S.RUNNING) if name == "cancel" else (S.QUEUED,)
        if name == "cancel":
            call = in_tx(sm, lambda s: endings_db.mark_cancelled(s, job_id))
        else:
            call = in_tx(sm, lambda s: endings_db.mark_cancelled_if_queued(s, job_id))
        if m.status in allowed:
            result = await call
            if name == "cancel":
                assert result == m.status, m.log  # reports where it came from
            m.status, m.cancel_requested = S.CANCELLED, True
            m.error_code, m.public = "CANCELLED", "The job was cancelled."
        else:
            with pytest.raises(IllegalTransition) as info:
                await call
            assert (info.value.from_status, info.value.to_status) == (m.status, S.CANCELLED)
            assert await get(sm, job_id) == before, m.log
    elif name == "request_cancel":
        assert await in_tx(sm, lambda s: lifecycle_db.request_cancel(s, job_id)) == m.status, m.log
        if m.status == S.RUNNING:
            after = await get(sm, job_id)
            if m.cancel_requested:  # the first request's time is kept
                assert after.cancel_requested_at == before.cancel_requested_at
            m.cancel_requested = True
        else:
            assert await get(sm, job_id) == before, m.log
    elif name == "note":
        async with sm.begin() as s:
            await lifecycle_db.record_attempt(s, job_id, attempt=1, internal_error=op[1])
        if m.status not in TERMINAL:  # a late attempt never rewrites why its job ended
            m.internal = op[1]
    else:  # pragma: no cover
        raise AssertionError(op)
    check_invariants(await get(sm, job_id), m)


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(OPS, min_size=1, max_size=12))
async def test_random_call_sequences_follow_the_transition_table(
    sessionmaker: SessionMaker, ops: list[Any]
) -> None:
    """Each example drives a fresh job; a legal call changes exactly what the table says, an
    illegal one raises IllegalTransition/LockConflict naming the states and changes nothing."""
    job_id = await insert_job(sessionmaker, user_id=f"prop-{uuid.uuid4().hex[:8]}")
    m = Model()
    check_invariants(await get(sessionmaker, job_id), m)
    for op in ops:
        await apply(sessionmaker, job_id, op, m)


# ---- lock (CAS queued -> running) -----------------------------------------------------------


async def test_concurrent_lockers_exactly_one_wins(db: SessionMaker) -> None:
    """Eight workflow runs race for each of ten queued jobs on separate connections."""
    jobs = [await insert_job(db) for _ in range(10)]
    runs = [f"run-{i}" for i in range(8)]

    async def attempt(job_id: uuid.UUID, run: str) -> tuple[uuid.UUID, str, object]:
        try:
            return (
                job_id,
                run,
                await in_tx(
                    db,
                    lambda s: lifecycle_db.lock(
                        s, job_id, owner=run, identity=f"w-{run}", ttl_s=TTL
                    ),
                ),
            )
        except LockConflict as exc:
            return job_id, run, exc

    results = await asyncio.gather(*(attempt(j, r) for j in jobs for r in runs))
    for job_id in jobs:
        mine = [(run, res) for j, run, res in results if j == job_id]
        winners = [run for run, res in mine if not isinstance(res, LockConflict)]
        losers = [res for _, res in mine if isinstance(res, LockConflict)]
        assert len(winners) == 1, mine
        assert len(losers) == len(runs) - 1
        row = await get(db, job_id)
        assert row.lifecycle_status == "running" and row.status == "processing"
        assert row.locked_by == owner_token(winners[0], f"w-{winners[0]}")
        assert all(exc.locked_by == row.locked_by for exc in losers)


async def test_same_run_relock_is_reacquired(db: SessionMaker) -> None:
    """A retried PREPARE (possibly on another worker) finds its own lock and succeeds."""
    job_id = await insert_job(db)
    first = await in_tx(
        db, lambda s: lifecycle_db.lock(s, job_id, owner="run-1", identity="w1", ttl_s=TTL)
    )
    assert not first.reacquired
    started = (await get(db, job_id)).started_at
    again = await in_tx(
        db, lambda s: lifecycle_db.lock(s, job_id, owner="run-1", identity="w2", ttl_s=TTL)
    )
    assert again.reacquired
    assert again.locked_by == owner_token("run-1", "w2")
    assert again.lock_until >= first.lock_until
    row = await get(db, job_id)
    assert row.started_at == started  # the first start is kept
    with pytest.raises(LockConflict):
        await in_tx(
            db, lambda s: lifecycle_db.lock(s, job_id, owner="run-2", identity="w1", ttl_s=TTL)
        )


async def test_missing_job_is_not_found(db: SessionMaker) -> None:
    missing = uuid.uuid4()
    with pytest.raises(JobNotFound):
        await in_tx(db, lambda s: lifecycle_db.lock(s, missing, owner="r", identity="w", ttl_s=TTL))
    with pytest.raises(JobNotFound):
        await in_tx(db, lambda s: mark_succeeded(s, missing))
    with pytest.raises(JobNotFound):
        await in_tx(db, lambda s: endings_db.mark_cancelled(s, missing))
    with pytest.raises(JobNotFound):
        await in_tx(db, lambda s: lifecycle_db.request_cancel(s, missing))
    assert not (
        await in_tx(db, lambda s: lifecycle_db.extend_lock(s, missing, owner="r", ttl_s=TTL))
    ).extended


# ---- heartbeat and expired locks ------------------------------------------------------------


async def test_extend_lock_only_for_the_owner_while_running(db: SessionMaker) -> None:
    queued = await insert_job(db)
    assert not (
        await in_tx(db, lambda s: lifecycle_db.extend_lock(s, queued, owner="run-1", ttl_s=TTL))
    ).extended

    job_id = await running_job(db, "run-1")
    before = await get(db, job_id)
    other = await in_tx(
        db, lambda s: lifecycle_db.extend_lock(s, job_id, owner="run-2", ttl_s=3600)
    )
    assert not other.extended
    assert await get(db, job_id) == before

    mine = await in_tx(db, lambda s: lifecycle_db.extend_lock(s, job_id, owner="run-1", ttl_s=3600))
    assert mine.extended and not mine.cancel_requested
    after = await get(db, job_id)
    assert after.lock_until is not None and before.lock_until is not None
    assert after.lock_until > before.lock_until

    assert await in_tx(db, lambda s: lifecycle_db.request_cancel(s, job_id)) == S.RUNNING
    assert (
        await in_tx(db, lambda s: lifecycle_db.extend_lock(s, job_id, owner="run-1", ttl_s=TTL))
    ).cancel_requested

    await in_tx(db, lambda s: mark_succeeded(s, job_id, owner="run-1"))
    done = await get(db, job_id)
    assert not (
        await in_tx(db, lambda s: lifecycle_db.extend_lock(s, job_id, owner="run-1", ttl_s=TTL))
    ).extended
    assert await get(db, job_id) == done


async def set_lock_until(sm: SessionMaker, job_id: uuid.UUID, seconds_from_now: int) -> None:
    async with sm.begin() as s:
        await s.execute(
            text("UPDATE ai_job SET lock_until = now() + make_interval(secs => :d) WHERE id = :id"),
            {"id": job_id, "d": seconds_from_now},
        )


async def test_find_expired_locks_returns_exactly_the_stale_running_jobs(db: SessionMaker) -> None:
    oldest = await running_job(db, "run-old")
    stale = await running_job(db, "run-stale")
    in_grace = await running_job(db, "run-grace")
    fresh = await running_job(db, "run-fresh")
    queued = await insert_job(db)
    failed = await running_job(db, "run-failed")
    await in_tx(db, lambda s: endings_db.mark_failed(s, failed, "PROVIDER_UNAVAILABLE", "p"))
    await set_lock_until(db, oldest, -600)
    await set_lock_until(db, stale, -120)
    await set_lock_until(db, in_grace, -5)  # expired, but within the 30 s grace
    # Non-running rows with a stale lock_until are never candidates.
    await set_lock_until(db, queued, -600)
    await set_lock_until(db, failed, -600)
    await in_tx(db, lambda s: lifecycle_db.request_cancel(s, stale))

    found = await in_tx(db, lambda s: reconciler_db.find_expired_locks(s, 30))
    assert [r.id for r in found] == [oldest, stale]  # oldest lock first
    by_id = {r.id: r for r in found}
    assert by_id[stale].workflow_id == f"ai-interactive:synthetic:{stale}"
    assert by_id[stale].locked_by == owner_token("run-stale", "w1")
    assert by_id[stale].cancel_requested_at is not None
    assert by_id[oldest].cancel_requested_at is None
    assert {r.id for r in await in_tx(db, lambda s: reconciler_db.find_expired_locks(s, 0))} == {
        oldest,
        stale,
        in_grace,
    }
    assert [
        r.id for r in await in_tx(db, lambda s: reconciler_db.find_expired_locks(s, 30, limit=1))
    ] == [oldest]
    assert fresh not in {
        r.id for r in await in_tx(db, lambda s: reconciler_db.find_expired_locks(s, 0))
    }


# ---- terminal writes ------------------------------------------------------------------------


async def test_mark_failed_keeps_codes_and_an_earlier_internal_message(db: SessionMaker) -> None:
    job_id = await running_job(db, "run-1")
    async with db.begin() as s:
        await lifecycle_db.record_attempt(s, job_id, attempt=2, internal_error="attempt 2: 502")
    await in_tx(
        db,
        lambda s: endings_db.mark_failed(
            s, job_id, "PROVIDER_UNAVAILABLE", "Provider down.", None, owner="run-1"
        ),
    )
    row = await get(db, job_id)
    assert (row.lifecycle_status, row.status) == ("failed", "failed")
    assert row.error_code == "PROVIDER_UNAVAILABLE"
    assert row.public_error_message == "Provider down."
    assert row.internal_error_message == "attempt 2: 502"
    assert row.finished_at is not None and row.lock_until is None
    assert row.attempt_count == 2

    other = await running_job(db, "run-2")
    await in_tx(
        db,
        lambda s: endings_db.mark_failed(
            s, other, "INTERNAL_ERROR", "Internal.", "Traceback: /srv/x.py"
        ),
    )
    row = await get(db, other)
    assert (row.error_code, row.public_error_message, row.internal_error_message) == (
        "INTERNAL_ERROR",
        "Internal.",
        "Traceback: /srv/x.py",
    )


class Rollback(Exception):
    pass


async def test_mark_succeeded_joins_the_callers_transaction(db: SessionMaker) -> None:
    job_id = await running_job(db, "run-1")
    with pytest.raises(Rollback):
        async with db.begin() as s:
            await mark_succeeded(s, job_id, owner="run-1")
            inside = (
                await s.execute(
                    text("SELECT lifecycle_status FROM ai_job WHERE id = :id"), {"id": job_id}
                )
            ).scalar_one()
            assert inside == "succeeded"
            # Not committed on its own: another connection still sees `running`.
            assert (await get(db, job_id)).lifecycle_status == "running"
            raise Rollback
    row = await get(db, job_id)
    assert (row.lifecycle_status, row.status, row.finished_at) == ("running", "processing", None)

    async with db.begin() as s:
        await mark_succeeded(s, job_id, owner="run-1")
    row = await get(db, job_id)
    assert (row.lifecycle_status, row.status, row.progress) == ("succeeded", "completed", 100)


async def test_mark_succeeded_by_another_run_is_a_lock_conflict(db: SessionMaker) -> None:
    job_id = await running_job(db, "run-1")
    before = await get(db, job_id)
    with pytest.raises(LockConflict):
        await in_tx(db, lambda s: mark_succeeded(s, job_id, owner="run-2"))
    with pytest.raises(LockConflict):
        await in_tx(
            db, lambda s: endings_db.mark_failed(s, job_id, "INTERNAL_ERROR", "x", owner="run-2")
        )
    assert await get(db, job_id) == before


async def test_cancel_racing_completion_leaves_one_terminal_state(db: SessionMaker) -> None:
    """The cancel CAS and the completion CAS on one running job, each in its own transaction;
    exactly one wins, the loser is told which terminal state it found."""
    jobs = [await running_job(db, f"run-{i}") for i in range(10)]

    async def cancel_in_tx(job_id: uuid.UUID) -> S:
        async with db.begin() as s:
            return await endings_db.mark_cancelled(s, job_id)

    async def succeed_in_tx(job_id: uuid.UUID, run: str) -> None:
        async with db.begin() as s:
            await mark_succeeded(s, job_id, owner=run)

    results = await asyncio.gather(
        *(
            call
            for i, j in enumerate(jobs)
            for call in (cancel_in_tx(j), succeed_in_tx(j, f"run-{i}"))
        ),
        return_exceptions=True,
    )
    for i, job_id in enumerate(jobs):
        cancel, succeed = results[2 * i], results[2 * i + 1]
        row = await get(db, job_id)
        assert row.lifecycle_status in ("cancelled", "succeeded")
        assert row.status == LEGACY_STATUS[S(row.lifecycle_status)]
        if row.lifecycle_status == "cancelled":
            assert cancel == S.RUNNING
            assert isinstance(succeed, IllegalTransition)
            assert (succeed.from_status, succeed.to_status) == ("cancelled", "succeeded")
        else:
            assert succeed is None
            assert isinstance(cancel, IllegalTransition)
            assert (cancel.from_status, cancel.to_status) == ("succeeded", "cancelled")
