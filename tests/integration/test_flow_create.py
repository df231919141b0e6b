"""Flow control at create and before dispatch, on a real PostgreSQL (jobs/flow.py): keyed
concurrency decided under the user's create lock from one read (supersede, skip, debounce), an
Idempotency-Key replay first, creates on two "processes" (two engines) seeing each other; a
debounced job's enqueue row due at its time (its chain capped); the relay's expiry of jobs it has
not dispatched; and the release of jobs an operator pause held, in fair order at the pace."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from db import pauses as pauses_db
from db.session import SessionMaker, make_engine, make_sessionmaker
from engine.errors import IdempotencyKeyReused, TooManyJobs, ValidationFailed
from engine.flow import Concurrency, PauseMatch
from engine.lifecycle import LifecycleStatus
from jobs import flow, lifecycle, pauses
from jobs.service import CreateJobRequest, CreatePolicy, JobService
from jobs.types import default_catalog, synthetic
from tests.integration.engine_helpers import execute, rows, scalar
from tests.stack import catalog_with, variant

NO_QUOTAS = CreatePolicy(max_active_jobs=0, max_jobs_per_day=0)
CANCELLED = LifecycleStatus.CANCELLED.value


def service(sm: SessionMaker, policy: CreatePolicy = NO_QUOTAS) -> JobService:
    return JobService(sm, default_catalog(), policy)


def request(user_id: str = "u1", n: int = 1, **kw: Any) -> CreateJobRequest:
    values: dict[str, Any] = {
        "user_id": user_id,
        "job_type": "synthetic",
        "target_type": "test",
        "target_id": "t1",
        "input": {"echo": {"n": n}},
    }
    values.update(kw)
    return CreateJobRequest(**values)


def keyed(mode: str, key: str = "k1", **kw: Any) -> Concurrency:
    return Concurrency(key=key, mode=mode, **kw)


async def job(db: SessionMaker, job_id: uuid.UUID) -> Any:
    [row] = await rows(
        db,
        "SELECT lifecycle_status, error_code, superseded_by, started_at, expires_at, "
        "deadline_at, reserved_cost_usd, concurrency FROM ai_job WHERE id = :j",
        j=job_id,
    )
    return row


async def enqueue_row(db: SessionMaker, job_id: uuid.UUID) -> Any:
    [row] = await rows(
        db,
        "SELECT status, available_at, created_at FROM outbox_event "
        "WHERE aggregate_id = :a AND event_type = 'ai.job.enqueue'",
        a=str(job_id),
    )
    return row


@contextlib.asynccontextmanager
async def second_process(database_url: str) -> AsyncIterator[JobService]:
    """Another API process's job service: its own engine and connections."""
    engine = make_engine(database_url, pool_size=5)
    try:
        yield service(make_sessionmaker(engine))
    finally:
        await engine.dispose()


async def test_supersede_ends_the_older_queued_jobs_in_the_create(db: SessionMaker) -> None:
    svc = service(db)
    first = (await svc.create(request(n=1, concurrency=keyed("supersede")))).job.id
    second = (await svc.create(request(n=2, concurrency=keyed("supersede")))).job.id
    other_key = (await svc.create(request(n=3, concurrency=keyed("supersede", "k2")))).job.id
    bobs = (await svc.create(request("bob", n=4, concurrency=keyed("supersede")))).job.id
    third = await svc.create(request(n=5, concurrency=keyed("supersede")))
    assert [h.id for h in third.flow.replaced] == [second]
    old = await job(db, first)
    assert (old.lifecycle_status, old.error_code, old.superseded_by) == (
        CANCELLED,
        "SUPERSEDED",
        second,
    )
    assert (await job(db, second)).superseded_by == third.job.id
    assert old.started_at is None
    # Never dispatched: its enqueue row is closed with it, no workflow will start.
    assert (await enqueue_row(db, second)).status == "published"
    for untouched in (other_key, bobs, third.job.id):
        assert (await job(db, untouched)).lifecycle_status == "queued"
    assert (await job(db, third.job.id)).concurrency == {"key": "k1", "mode": "supersede"}


async def test_skip_answers_with_the_holder_whatever_else_the_create_says(
    db: SessionMaker,
) -> None:
    svc = service(db)
    held = await svc.create(request(n=1, concurrency=keyed("skip")))
    assert held.created
    again = await svc.create(
        request(n=2, job_type="synthetic", target_id="other", concurrency=keyed("skip"))
    )
    assert not again.created and again.job.id == held.job.id
    # Another user's key is theirs.
    assert (await svc.create(request("bob", concurrency=keyed("skip")))).created
    # Once the holder ended, the key is free again.
    await execute(
        db,
        "UPDATE ai_job SET lifecycle_status = 'cancelled', status = 'cancelled' WHERE id = :j",
        j=held.job.id,
    )
    later = await svc.create(request(n=3, concurrency=keyed("skip")))
    assert later.created and later.job.id != held.job.id


async def test_a_skip_whose_key_is_held_is_not_refused_by_a_full_quota(db: SessionMaker) -> None:
    svc = service(db, CreatePolicy(max_active_jobs=1, max_jobs_per_day=0))
    held = (await svc.create(request(concurrency=keyed("skip")))).job.id
    assert (await svc.create(request(n=2, concurrency=keyed("skip")))).job.id == held
    with pytest.raises(TooManyJobs):
        await svc.create(request(n=3))


async def test_an_idempotent_replay_is_decided_before_the_key(db: SessionMaker) -> None:
    svc = service(db)
    first = await svc.create(request(idempotency_key="idem", concurrency=keyed("supersede")))
    replay = await svc.create(request(idempotency_key="idem", concurrency=keyed("supersede")))
    assert not replay.created and replay.job.id == first.job.id
    assert (await job(db, first.job.id)).lifecycle_status == "queued"  # not superseded by itself
    # `concurrency` is part of the request the key stands for.
    with pytest.raises(IdempotencyKeyReused):
        await svc.create(request(idempotency_key="idem", concurrency=keyed("skip")))


async def test_racing_skip_creates_on_two_processes_make_one_job(
    db: SessionMaker, database_url: str
) -> None:
    async with second_process(database_url) as other:
        here = service(db)
        results = await asyncio.gather(
            *(
                (here if i % 2 else other).create(request(n=i, concurrency=keyed("skip")))
                for i in range(6)
            )
        )
    assert sum(r.created for r in results) == 1
    assert len({r.job.id for r in results}) == 1
    assert await scalar(db, "SELECT count(*) FROM ai_job") == 1


async def test_debounce_replaces_the_queued_chain_and_waits_its_delay_capped(
    db: SessionMaker, database_url: str
) -> None:
    def debounce(n: int) -> CreateJobRequest:
        return request(n=n, concurrency=keyed("debounce", delay_ms=4000, max_delay_ms=5000))

    async with second_process(database_url) as other:
        ids = []
        for n in range(4):
            ids.append((await (other if n % 2 else service(db)).create(debounce(n))).job.id)
            if n == 1:
                await asyncio.sleep(1.2)  # the chain's cap (5 s from the first) comes first
    for older, newer in itertools.pairwise(ids):
        got = await job(db, older)
        assert (got.lifecycle_status, got.error_code, got.superseded_by) == (
            CANCELLED,
            "SUPERSEDED",
            newer,
        )
        assert Decimal(got.reserved_cost_usd) >= 0 and got.started_at is None
    last = await enqueue_row(db, ids[-1])
    [first_created] = await rows(db, "SELECT created_at FROM ai_job WHERE id = :j", j=ids[0])
    # Its own delay would end after the cap: the chain's first create + its maxDelayMs.
    cap = first_created.created_at + timedelta(milliseconds=5000)
    assert abs((last.available_at - cap).total_seconds()) < 0.5, (last.available_at, cap)
    assert last.available_at > last.created_at + timedelta(seconds=2)


async def test_debounce_leaves_a_running_job_alone(db: SessionMaker) -> None:
    svc = service(db)
    c = keyed("debounce", delay_ms=100)
    running = (await svc.create(request(concurrency=c))).job.id
    await execute(
        db,
        "UPDATE ai_job SET lifecycle_status = 'running', status = 'processing' WHERE id = :j",
        j=running,
    )
    new = await svc.create(request(n=2, concurrency=c))
    assert new.created and not new.flow.replaced and not new.flow.running
    assert (await job(db, running)).lifecycle_status == "running"


async def test_settings_that_guarantee_expiry_are_refused_at_their_field(
    db: SessionMaker,
) -> None:
    svc = service(db)
    now = datetime.now(UTC)
    cases: list[tuple[dict[str, Any], list[str]]] = [
        (
            {"concurrency": keyed("debounce", delay_ms=5000), "ttl_seconds": 2},
            ["body", "ttlSeconds"],
        ),
        (
            {"run_at": now + timedelta(hours=1), "deadline": now + timedelta(minutes=30)},
            ["body", "deadline"],
        ),
        (
            {
                "concurrency": keyed("debounce", delay_ms=60_000),
                "deadline": now + timedelta(seconds=30),
            },
            ["body", "deadline"],
        ),
        ({"concurrency": keyed("debounce")}, ["body", "concurrency", "delayMs"]),
        (
            {"concurrency": keyed("debounce", delay_ms=500, max_delay_ms=200)},
            ["body", "concurrency", "maxDelayMs"],
        ),
        ({"concurrency": keyed("skip", delay_ms=500)}, ["body", "concurrency"]),
    ]
    for kw, loc in cases:
        with pytest.raises(ValidationFailed) as err:
            await svc.create(request(**kw))
        assert err.value.errors[0]["loc"] == loc, (kw, err.value.errors)
    assert await scalar(db, "SELECT count(*) FROM ai_job") == 0


async def test_ttl_defaults_and_the_relay_expires_what_it_has_not_dispatched(
    db: SessionMaker,
) -> None:
    svc = service(db, CreatePolicy(max_active_jobs=0, max_jobs_per_day=0, default_ttl_s=60))
    defaulted = (await svc.create(request())).job.id
    off = (await svc.create(request(n=2, ttl_seconds=0))).job.id
    short = (await svc.create(request(n=3, ttl_seconds=1))).job.id
    late = (
        await svc.create(request(n=4, deadline=datetime.now(UTC) + timedelta(seconds=1.5)))
    ).job.id
    assert (await job(db, off)).expires_at is None
    got = await job(db, defaulted)
    assert 55 < (got.expires_at - datetime.now(UTC)).total_seconds() <= 60
    assert await flow.expire_undispatched(db, 100) == []  # nothing due yet
    await asyncio.sleep(1.7)
    ended = await flow.expire_undispatched(db, 100)
    assert sorted(ended) == [("synthetic", "JOB_DEADLINE_EXCEEDED"), ("synthetic", "JOB_EXPIRED")]
    for job_id, code in ((short, "JOB_EXPIRED"), (late, "JOB_DEADLINE_EXCEEDED")):
        row = await job(db, job_id)
        assert (row.lifecycle_status, row.error_code, row.started_at) == (CANCELLED, code, None)
        assert (await enqueue_row(db, job_id)).status == "published"  # no workflow will run
    events = await rows(
        db,
        "SELECT payload FROM outbox_event WHERE event_type = 'ai.job.cancelled' "
        "AND aggregate_id = :a",
        a=str(short),
    )
    assert [e.payload["errorCode"] for e in events] == ["JOB_EXPIRED"]
    assert (await job(db, defaulted)).lifecycle_status == "queued"


async def _held(db: SessionMaker, user: str, n: int) -> uuid.UUID:
    job_id = (await service(db).create(request(user, n=n))).job.id
    async with db.begin() as s:
        await pauses_db.hold(
            s,
            job_id,
            user_id=user,
            workflow_id=f"wf-{user}-{n}",
            job_type="synthetic",
            provider="synthetic",
            model="synthetic",
        )
    return job_id


async def test_held_jobs_are_released_in_fair_order_at_the_pace(db: SessionMaker) -> None:
    admin = pauses.Pauses(db)
    pause = await admin.create(
        PauseMatch(job_type="synthetic"), reason="testing", expires_at=None, actor="root"
    )
    for n in range(4):
        await _held(db, "a", n)
    for n in range(2):
        await _held(db, "b", n)
    nothing = await pauses.release(db, rate=10)
    assert nothing.workflow_ids == [] and not nothing.more  # the pause still holds them
    await admin.delete(pause.id, actor="root")
    started = time.monotonic()
    first = await pauses.release(db, rate=10)
    assert first.workflow_ids == ["wf-a-0", "wf-b-0", "wf-a-1", "wf-b-1", "wf-a-2", "wf-a-3"]
    offsets = [at for _, at in first.slots]
    assert offsets == sorted(offsets) and offsets[0] < 0.05
    assert all(abs(b - a - 0.1) < 1e-6 for a, b in itertools.pairwise(offsets))  # 1/rate apart
    assert not first.more
    # Another pass right after starts where the reserved slots end (the pace is shared).
    await _held(db, "c", 0)
    second = await pauses.release(db, rate=10)
    between = time.monotonic() - started  # how long after the first pass the second ran
    [(wf, at)] = second.slots
    # The slot after the last reserved one (0.6 s after the first pass), seen from the second.
    assert wf == "wf-c-0" and 0.6 - between - 0.01 < at <= 0.6 + 0.05, (at, between)
    assert await scalar(db, "SELECT count(*) FROM ai_pause_hold") == 0
    audit = await rows(db, "SELECT actor, action, outcome, target_id FROM admin_audit ORDER BY id")
    assert [(a.actor, a.action, a.outcome) for a in audit] == [
        ("root", "pause.create", "paused"),
        ("root", "pause.delete", "resumed"),
    ]
    assert {a.target_id for a in audit} == {str(pause.id)}


async def test_an_expired_pause_is_lifted_by_the_system(db: SessionMaker) -> None:
    admin = pauses.Pauses(db)
    soon = datetime.now(UTC) + timedelta(seconds=1)
    pause = await admin.create(PauseMatch(user_id="a"), reason="r", expires_at=soon, actor="root")
    assert [p.id for p in await admin.listed()] == [pause.id]
    assert await pauses.lift_expired(db) == []
    await asyncio.sleep(1.2)
    assert await admin.listed() == []  # no longer in force
    assert [p.id for p in await pauses.lift_expired(db)] == [pause.id]
    [entry] = await rows(db, "SELECT actor, outcome FROM admin_audit WHERE action = 'pause.expire'")
    assert (entry.actor, entry.outcome) == ("system", "resumed")
    assert await execute(db, "DELETE FROM ai_pause") == 0


async def test_supersede_asks_a_running_job_to_stop_unless_its_type_cannot_be(
    db: SessionMaker,
) -> None:
    stuck = variant(synthetic.JOB, "synthetic_stuck", cancellable=False)
    svc = JobService(db, catalog_with(stuck), NO_QUOTAS)
    key = keyed("supersede")
    fixed = (await svc.create(request(n=2, job_type="synthetic_stuck", concurrency=key))).job.id
    await _start(db, fixed)
    running = (await svc.create(request(concurrency=key))).job.id  # leaves `fixed` running
    await _start(db, running)
    cancelled: list[str] = []

    async def cancel_workflow(wf: str) -> None:
        cancelled.append(wf)

    new = await svc.create(request(n=3, concurrency=key), cancel_workflow=cancel_workflow)
    assert new.created and [h.id for h in new.flow.running] == [running]
    [asked] = await rows(
        db, "SELECT cancel_requested_at, cancel_code FROM ai_job WHERE id = :j", j=running
    )
    assert asked.cancel_requested_at is not None and asked.cancel_code == "SUPERSEDED"
    assert cancelled == [f"ai-interactive:synthetic:{running}"]
    left = await job(db, fixed)
    assert (left.lifecycle_status, left.superseded_by) == ("running", None)
    # Its workflow's finalizer ends it with the code the request recorded.
    async with db.begin() as s:
        await lifecycle.cancel(s, running)
    ended = await job(db, running)
    assert (ended.lifecycle_status, ended.error_code, ended.superseded_by) == (
        CANCELLED,
        "SUPERSEDED",
        new.job.id,
    )


async def _start(db: SessionMaker, job_id: uuid.UUID) -> None:
    await execute(
        db,
        "UPDATE ai_job SET lifecycle_status = 'running', status = 'processing' WHERE id = :j",
        j=job_id,
    )
