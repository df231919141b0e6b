"""The job use cases on a real PostgreSQL: create is one
transaction (job + snapshot + outbox row + NOTIFY), idempotent under concurrency, quota-checked
without overshoot; cancel and admin retry follow the lifecycle table."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import uuid
from collections import Counter
from decimal import Decimal
from types import ModuleType
from typing import Any

import psycopg
import pytest
from sqlalchemy import event, text

from db import endings as endings_db
from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db import snapshots as snapshots_db
from db import usage as usage_db
from db.jobs import JobRow
from db.session import SessionMaker, libpq_url
from db.usage import UsageRow
from engine.errors import (
    IdempotencyKeyReused,
    JobAlreadyCancelled,
    JobNotCancellable,
    JobNotFound,
    JobNotRetryable,
    QuotaExceeded,
    TooManyJobs,
    UnknownJobType,
)
from jobs.service import SNAPSHOT_VERBATIM, CreateJobRequest, CreatePolicy, JobService
from jobs.types import default_catalog
from tests.integration.engine_helpers import mark_succeeded

NO_QUOTAS = CreatePolicy(max_active_jobs=0, max_jobs_per_day=0)


def service(sm: SessionMaker, policy: CreatePolicy = NO_QUOTAS) -> JobService:
    return JobService(sm, default_catalog(), policy)


def request(user_id: str = "u1", **kw: Any) -> CreateJobRequest:
    values: dict[str, Any] = {
        "user_id": user_id,
        "job_type": "synthetic",
        "target_type": "test",
        "target_id": "t1",
        "input": {"echo": {"n": 1}},
    }
    values.update(kw)
    return CreateJobRequest(**values)


async def counts(sm: SessionMaker) -> tuple[int, int, int]:
    """(ai_job, ai_job_snapshot, outbox_event) rows."""
    async with sm() as s:
        row = (
            await s.execute(
                text(
                    "SELECT (SELECT count(*) FROM ai_job), (SELECT count(*) FROM ai_job_snapshot), "
                    "(SELECT count(*) FROM outbox_event)"
                )
            )
        ).one()
    return (row[0], row[1], row[2])


async def get(sm: SessionMaker, job_id: uuid.UUID) -> JobRow:
    async with sm() as s:
        row = await jobs_db.get(s, job_id)
    assert row is not None
    return row


# ---- idempotency under concurrency ---------------------------------------------------------


@pytest.mark.parametrize(
    "policy",
    [NO_QUOTAS, CreatePolicy(max_active_jobs=1, max_jobs_per_day=1)],
    ids=["unique-violation-path", "advisory-lock-path"],
)
async def test_fifty_concurrent_creates_with_one_key_make_one_job(
    db: SessionMaker, policy: CreatePolicy
) -> None:
    """With quotas off, the losers hit the unique constraint and resolve to the winner; with
    quotas on (and tight: 1 active, 1 per day), the per-user advisory lock serialises them and
    the losers find the winner under the lock instead of failing the quota."""
    svc = service(db, policy)
    req = request(idempotency_key="key-1")
    results = await asyncio.gather(*(svc.create(req) for _ in range(50)))
    assert len({r.job.id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert await counts(db) == (1, 1, 1)
    # A later repeat returns the same job, too.
    again = await svc.create(req)
    assert (again.job.id, again.created) == (results[0].job.id, False)


async def test_same_key_different_body_is_rejected(db: SessionMaker) -> None:
    svc = service(db)
    first = await svc.create(request(idempotency_key="key-1"))
    with pytest.raises(IdempotencyKeyReused):
        await svc.create(request(idempotency_key="key-1", input={"echo": {"n": 2}}))
    with pytest.raises(IdempotencyKeyReused):
        await svc.create(request(idempotency_key="key-1", priority=10))
    assert await counts(db) == (1, 1, 1)
    # The key is scoped to the user: another user may use it.
    other = await svc.create(request("u2", idempotency_key="key-1", input={"echo": {"n": 2}}))
    assert other.created and other.job.id != first.job.id


async def test_a_duplicate_create_logs_the_specifications_marker_without_content(
    db: SessionMaker, caplog: pytest.LogCaptureFixture
) -> None:
    svc = service(db)
    secret = "duplicate-sentinel-text"
    req = request(idempotency_key="dup-key-1", input={"echo": {"text": secret}})
    first = await svc.create(req)
    with caplog.at_level(logging.INFO, logger="jobs.creation"):
        again = await svc.create(req)
    assert (again.job.id, again.created) == (first.job.id, False)
    (rec,) = [r for r in caplog.records if r.getMessage().startswith("{{##duplicate}}")]
    assert (rec.job_id, rec.job_type) == (str(first.job.id), "synthetic")  # type: ignore[attr-defined]
    assert secret not in str(rec.__dict__) and "dup-key-1" not in str(rec.__dict__)


async def test_same_key_different_bodies_racing(db: SessionMaker) -> None:
    svc = service(db)
    results = await asyncio.gather(
        svc.create(request(idempotency_key="key-1", input={"echo": {"n": 1}})),
        svc.create(request(idempotency_key="key-1", input={"echo": {"n": 2}})),
        return_exceptions=True,
    )
    assert sorted(type(r).__name__ for r in results) == ["CreateJobResult", "IdempotencyKeyReused"]
    assert await counts(db) == (1, 1, 1)


async def test_unknown_job_type(db: SessionMaker) -> None:
    with pytest.raises(UnknownJobType):
        await service(db).create(request(job_type="no_such_type"))
    assert await counts(db) == (0, 0, 0)


# ---- quotas ---------------------------------------------------------------------------------


async def test_active_job_quota_does_not_overshoot_under_concurrency(db: SessionMaker) -> None:
    svc = service(db, CreatePolicy(max_active_jobs=5, max_jobs_per_day=0))
    results = await asyncio.gather(
        *(svc.create(request(target_id=f"t{i}")) for i in range(20)), return_exceptions=True
    )
    kinds = Counter(type(r).__name__ for r in results)
    assert kinds == {"CreateJobResult": 5, "TooManyJobs": 15}, results
    assert all(r.http_status == 429 for r in results if isinstance(r, TooManyJobs))
    assert await counts(db) == (5, 5, 5)

    assert (await svc.create(request("u2"))).created  # another user is unaffected
    # Ending one active job frees a slot.
    done = next(r for r in results if not isinstance(r, BaseException))
    async with db.begin() as s:
        await endings_db.mark_cancelled(s, done.job.id)
    assert (await svc.create(request(target_id="t-again"))).created
    with pytest.raises(TooManyJobs):
        await svc.create(request(target_id="t-over"))


async def test_daily_quota(db: SessionMaker) -> None:
    svc = service(db, CreatePolicy(max_active_jobs=0, max_jobs_per_day=3))
    created = [await svc.create(request(target_id=f"t{i}")) for i in range(3)]
    assert all(c.created for c in created)
    # Cancelling does not give the day's quota back.
    async with db.begin() as s:
        await endings_db.mark_cancelled(s, created[0].job.id)
    with pytest.raises(QuotaExceeded) as info:
        await svc.create(request(target_id="t4"))
    assert info.value.retry_after_s is not None
    assert 1 <= info.value.retry_after_s <= 86_400
    assert info.value.code == "QUOTA_EXCEEDED"
    assert (await svc.create(request("u2"))).created
    assert await counts(db) == (4, 4, 4)


# ---- the create transaction -----------------------------------------------------------------


class InjectedFailure(Exception):
    pass


async def listener(database_url: str) -> psycopg.AsyncConnection[Any]:
    conn = await psycopg.AsyncConnection.connect(libpq_url(database_url), autocommit=True)
    await conn.execute("LISTEN ai_outbox")
    return conn


async def next_notify(conn: psycopg.AsyncConnection[Any]) -> psycopg.Notify:
    async for n in conn.notifies(timeout=30, stop_after=1):
        return n
    raise AssertionError("no notification")


async def test_create_writes_job_snapshot_and_outbox_in_one_transaction(
    db: SessionMaker, database_url: str
) -> None:
    conn = await listener(database_url)
    try:
        inp = {"echo": {"contact": "ada@example.com", "n": 1}}
        res = await service(db).create(request(input=inp, priority=7))
        note = await next_notify(conn)
    finally:
        await conn.close()
    assert note.channel == "ai_outbox"
    job = res.job
    assert res.created
    assert (job.lifecycle_status, job.status, job.progress) == ("queued", "pending", 0)
    assert job.workflow_id == f"ai-interactive:synthetic:{job.id}"
    assert job.input["echo"] == inp["echo"]  # the job keeps the normalized input
    assert job.priority == 7 and job.queue_name == "ai-interactive"
    async with db() as s:
        snap = (
            await s.execute(
                text("SELECT content, redaction_version FROM ai_job_snapshot WHERE job_id = :id"),
                {"id": job.id},
            )
        ).one()
        (event,) = (await s.execute(text("SELECT * FROM outbox_event"))).all()
    # The snapshot keeps what the user wrote: prompts are built from it (a "[email]" would
    # change their meaning); it is private data under the retention rule.
    assert snap.redaction_version == SNAPSHOT_VERBATIM
    assert snap.content == {"input": job.input, "targetType": "test", "targetId": "t1"}
    assert snap.content["input"]["echo"]["contact"] == "ada@example.com"
    assert event.payload == {
        "jobId": str(job.id),
        "jobType": "synthetic",
        "queueName": "ai-interactive",
        "priority": 7,
        "fairnessKey": CreatePolicy().fairness_key("u1"),
        "fairnessWeight": 1.0,
        "userActive": 1,  # the user's active jobs, this one included
    }
    assert "u1" not in str(event.payload["fairnessKey"])
    assert (event.event_type, event.aggregate_type, event.aggregate_id) == (
        "ai.job.enqueue",
        "AiJob",
        str(job.id),
    )
    assert (event.status, event.attempt_count) == ("pending", 0)
    assert event.dedupe_key == f"ai.job.enqueue:{job.id}"


async def test_the_enqueue_dedupe_key_is_the_job_id_alone(db: SessionMaker) -> None:
    """No client-chosen key, user id or job type goes into it: nothing can collide."""
    a = (await service(db).create(request(idempotency_key="click-1"))).job
    b = (await service(db).create(request(idempotency_key=f"ai.job.enqueue:{a.id}"))).job
    async with db() as s:
        keys = (
            (await s.execute(text("SELECT dedupe_key FROM outbox_event ORDER BY id")))
            .scalars()
            .all()
        )
    assert keys == [f"ai.job.enqueue:{a.id}", f"ai.job.enqueue:{b.id}"]


# The snapshot and the enqueue row are one statement (db/snapshots.py
# insert_snapshot_and_enqueue).
STEPS = [
    (lifecycle_db, "create_seeing_rollout"),
    (snapshots_db, "insert_snapshot_and_enqueue"),
]


@pytest.mark.parametrize(("module", "method"), STEPS, ids=[f"{m.__name__}.{f}" for m, f in STEPS])
async def test_a_failure_at_any_step_leaves_nothing_behind(
    db: SessionMaker,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    module: ModuleType,
    method: str,
) -> None:
    """The step runs for real (its row and NOTIFY are in the transaction), then fails: the job,
    the snapshot and the outbox row all roll back, and relays are not woken."""
    svc = service(db)
    real = getattr(module, method)
    calls: list[str] = []

    async def fail_after(*args: Any, **kw: Any) -> Any:
        await real(*args, **kw)
        calls.append(method)
        raise InjectedFailure(method)

    monkeypatch.setattr(module, method, fail_after)
    conn = await listener(database_url)
    try:
        with pytest.raises(InjectedFailure):
            await svc.create(request(idempotency_key="k"))
        assert calls == [method]
        assert await counts(db) == (0, 0, 0)
        # Notifications arrive in commit order: if the failed create had notified, that would
        # come before this marker.
        async with db.begin() as s:
            await s.execute(text("NOTIFY ai_outbox, 'marker'"))
        assert (await next_notify(conn)).payload == "marker"
    finally:
        await conn.close()
    monkeypatch.undo()
    assert (await svc.create(request(idempotency_key="k"))).created  # the key is still free
    assert await counts(db) == (1, 1, 1)


# ---- cancel ---------------------------------------------------------------------------------


class CancelRecorder:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.fail = fail

    async def __call__(self, workflow_id: str) -> None:
        self.calls.append(workflow_id)
        if self.fail:
            raise ConnectionError("temporal unreachable")


async def test_cancel_a_queued_job(db: SessionMaker) -> None:
    svc = service(db)
    job = (await svc.create(request())).job
    rec = CancelRecorder()
    res = await svc.cancel(job.id, "u1", cancel_workflow=rec)
    assert (res.job_id, res.outcome) == (job.id, "cancelled")
    # Its workflow (if the relay already started it, waiting for an EXECUTE slot) is told to
    # end now; one started later finds the job cancelled in EXECUTE's first transaction.
    assert rec.calls == [job.workflow_id]
    row = await get(db, job.id)
    assert (row.lifecycle_status, row.status, row.error_code) == (
        "cancelled",
        "cancelled",
        "CANCELLED",
    )
    assert row.finished_at is not None and row.cancel_requested_at is not None
    with pytest.raises(JobAlreadyCancelled):
        await svc.cancel(job.id, "u1", cancel_workflow=rec)


async def test_concurrent_cancels_of_a_queued_job(db: SessionMaker) -> None:
    svc = service(db)
    job = (await svc.create(request())).job
    results = await asyncio.gather(
        *(svc.cancel(job.id, "u1") for _ in range(5)), return_exceptions=True
    )
    kinds = Counter(type(r).__name__ for r in results)
    assert kinds == {"CancelResult": 1, "JobAlreadyCancelled": 4}, results


async def test_cancel_a_finished_job(db: SessionMaker) -> None:
    svc = service(db)
    done = (await svc.create(request(target_id="a"))).job
    failed = (await svc.create(request(target_id="b"))).job
    async with db.begin() as s:
        await lifecycle_db.lock(s, done.id, owner="run-1", identity="w", ttl_s=60)
        await mark_succeeded(s, done.id, owner="run-1")
        await lifecycle_db.lock(s, failed.id, owner="run-2", identity="w", ttl_s=60)
        await endings_db.mark_failed(s, failed.id, "PROVIDER_UNAVAILABLE", "down")
    for job_id, status in ((done.id, "succeeded"), (failed.id, "failed")):
        before = await get(db, job_id)
        with pytest.raises(JobNotCancellable):
            await svc.cancel(job_id, "u1", cancel_workflow=CancelRecorder())
        after = await get(db, job_id)
        assert after == before and after.lifecycle_status == status


async def test_cancel_a_running_job_requests_it(db: SessionMaker) -> None:
    svc = service(db)
    job = (await svc.create(request())).job
    async with db.begin() as s:
        await lifecycle_db.lock(s, job.id, owner="run-1", identity="w", ttl_s=60)
    rec = CancelRecorder()
    res = await svc.cancel(job.id, "u1", cancel_workflow=rec)
    assert res.outcome == "cancel_requested"
    assert rec.calls == [job.workflow_id]
    row = await get(db, job.id)
    assert row.lifecycle_status == "running"  # the workflow ends it
    assert row.cancel_requested_at is not None and row.finished_at is None
    # Asking again re-sends the cancel; the first request time is kept. A failing Temporal call
    # is not the caller's problem: the request is recorded in SQL.
    failing = CancelRecorder(fail=True)
    again = await svc.cancel(job.id, "u1", cancel_workflow=failing)
    assert again.outcome == "cancel_requested"
    assert failing.calls == [job.workflow_id]
    assert (await get(db, job.id)).cancel_requested_at == row.cancel_requested_at


async def test_cancel_someone_elses_job_is_not_found(db: SessionMaker) -> None:
    svc = service(db)
    job = (await svc.create(request("owner"))).job
    rec = CancelRecorder()
    with pytest.raises(JobNotFound):
        await svc.cancel(job.id, "intruder", cancel_workflow=rec)
    with pytest.raises(JobNotFound):
        await svc.cancel(uuid.uuid4(), "owner", cancel_workflow=rec)
    assert (await get(db, job.id)).lifecycle_status == "queued"
    assert rec.calls == []
    assert (await svc.cancel(job.id, "admin", admin=True)).outcome == "cancelled"


# ---- admin retry ----------------------------------------------------------------------------


async def failed_job(svc: JobService, sm: SessionMaker, **kw: Any) -> JobRow:
    job = (await svc.create(request(**kw))).job
    async with sm.begin() as s:
        await lifecycle_db.lock(s, job.id, owner="run-1", identity="w", ttl_s=60)
        await endings_db.mark_failed(s, job.id, "PROVIDER_UNAVAILABLE", "down")
    return await get(sm, job.id)


async def test_retry_a_failed_job_makes_one_new_job(db: SessionMaker) -> None:
    svc = service(db)
    old = await failed_job(svc, db, input={"echo": {"n": 5}}, priority=20, target_id="t9")
    first = await svc.retry(old.id)
    assert first.created and first.job.id != old.id
    new = first.job
    assert new.retried_from_job_id == old.id
    assert (new.input, new.priority, new.target_type, new.target_id, new.job_type) == (
        old.input,
        old.priority,
        old.target_type,
        old.target_id,
        old.job_type,
    )
    assert (new.lifecycle_status, new.user_id) == ("queued", old.user_id)
    second = await svc.retry(old.id)
    assert (second.job.id, second.created) == (new.id, False)
    assert await counts(db) == (2, 2, 2)
    assert (await get(db, old.id)).lifecycle_status == "failed"  # never a transition back


async def test_concurrent_retries_make_one_new_job(db: SessionMaker) -> None:
    svc = service(db)
    old = await failed_job(svc, db)
    results = await asyncio.gather(*(svc.retry(old.id) for _ in range(10)))
    assert len({r.job.id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert await counts(db) == (2, 2, 2)


async def test_retry_a_cancelled_job(db: SessionMaker) -> None:
    svc = service(db)
    job = (await svc.create(request())).job
    await svc.cancel(job.id, "u1")
    res = await svc.retry(job.id)
    assert res.created and res.job.retried_from_job_id == job.id


async def test_retry_bypasses_quotas(db: SessionMaker) -> None:
    svc = service(db, CreatePolicy(max_active_jobs=1, max_jobs_per_day=1))
    old = await failed_job(svc, db)
    with pytest.raises(QuotaExceeded):
        await svc.create(request(target_id="other"))
    # Only with the admin's override: a retry is the owner's job, within the owner's quotas.
    assert (await svc.retry(old.id, override_budget=True)).created


async def test_retry_of_queued_running_or_succeeded_is_refused(db: SessionMaker) -> None:
    svc = service(db)
    queued = (await svc.create(request(target_id="q"))).job
    running = (await svc.create(request(target_id="r"))).job
    done = (await svc.create(request(target_id="s"))).job
    async with db.begin() as s:
        await lifecycle_db.lock(s, running.id, owner="run-r", identity="w", ttl_s=60)
        await lifecycle_db.lock(s, done.id, owner="run-s", identity="w", ttl_s=60)
        await mark_succeeded(s, done.id)
    for job_id in (queued.id, running.id, done.id):
        with pytest.raises(JobNotRetryable):
            await svc.retry(job_id)
    with pytest.raises(JobNotFound):
        await svc.retry(uuid.uuid4())
    assert await counts(db) == (3, 3, 3)


async def _backdate(sm: SessionMaker, job_ids: list[uuid.UUID], when: dt.datetime) -> None:
    async with sm.begin() as s:
        await s.execute(
            text("UPDATE ai_job SET created_at = :w WHERE id = ANY(:ids)"),
            {"w": when, "ids": job_ids},
        )


async def test_monthly_quota_counts_the_utc_month(db: SessionMaker) -> None:
    svc = service(db, CreatePolicy(max_active_jobs=0, max_jobs_per_day=0, max_jobs_per_month=2))
    now = dt.datetime.now(dt.UTC)
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    first = [(await svc.create(request(target_id=f"t{i}"))).job.id for i in range(2)]
    # One second into this UTC month counts; one second before it does not.
    await _backdate(db, first[:1], month_start + dt.timedelta(seconds=1))
    await _backdate(db, first[1:], month_start - dt.timedelta(seconds=1))
    assert (await svc.create(request(target_id="t3"))).created
    with pytest.raises(QuotaExceeded) as info:
        await svc.create(request(target_id="t4"))
    assert "per month" in info.value.public_message
    next_month = (month_start + dt.timedelta(days=32)).replace(day=1)
    expected = (next_month - dt.datetime.now(dt.UTC)).total_seconds()
    assert info.value.retry_after_s is not None
    assert abs(info.value.retry_after_s - expected) <= 5
    assert (await svc.create(request("u2"))).created  # per user


async def test_the_daily_quota_starts_at_utc_midnight(db: SessionMaker) -> None:
    svc = service(db, CreatePolicy(max_active_jobs=0, max_jobs_per_day=1))
    job = (await svc.create(request())).job.id
    midnight = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    await _backdate(db, [job], midnight - dt.timedelta(seconds=1))
    # One second before UTC midnight is yesterday: the boundary is computed in UTC by the
    # service, not by the database's time zone.
    assert (await svc.create(request(target_id="t2"))).created
    with pytest.raises(QuotaExceeded):
        await svc.create(request(target_id="t3"))


async def test_monthly_cost_budget(db: SessionMaker) -> None:
    svc = service(
        db, CreatePolicy(max_active_jobs=0, max_jobs_per_day=0, max_cost_usd_per_month=1.0)
    )
    job = (await svc.create(request())).job
    async with db.begin() as s:
        # Through the repository: budgets read the daily rollup its insert keeps.
        await usage_db.insert(
            s,
            UsageRow(
                job_id=job.id,
                user_id="u1",
                job_type=job.job_type,
                attempt_no=1,
                credential_mode="platform_key",
                provider="deepseek",
                model="deepseek-chat",
                tokens_in=1,
                tokens_out=1,
                cost_usd=Decimal("1.5"),
                latency_ms=1,
                error_code=None,
            ),
        )
    with pytest.raises(QuotaExceeded) as info:
        await svc.create(request(target_id="t2"))
    assert "monthly" in info.value.public_message


async def test_the_fingerprint_includes_the_credential_mode(db: SessionMaker) -> None:
    """Same key, same body, another payer: a different request."""
    svc = JobService(db, default_catalog(), NO_QUOTAS, credential_lookup=lambda _s, _u: _some_key())
    await svc.create(request(job_type="quiz_generation", idempotency_key="k", input=QUIZ_INPUT))
    with pytest.raises(IdempotencyKeyReused):
        await svc.create(
            request(
                job_type="quiz_generation",
                idempotency_key="k",
                input=QUIZ_INPUT,
                credential_mode="user_deepseek_key",
            )
        )


QUIZ_INPUT = {"sourceText": "Photosynthesis happens in chloroplasts.", "count": 1}


async def _some_key() -> uuid.UUID:
    return uuid.uuid4()


async def test_a_create_takes_six_round_trips_with_quotas_on(db: SessionMaker) -> None:
    """The create path's statements, counted as PostgreSQL sees them: BEGIN, the user's lock,
    the three quota counts in one SELECT, the job (read back by its own INSERT ... RETURNING),
    its snapshot and its enqueue row in one statement (waking the relays), COMMIT."""
    engine: Any = db().bind.sync_engine  # type: ignore[union-attr]
    sent: list[str] = []

    def on_statement(*args: Any) -> None:
        sent.append(" ".join(str(args[2]).split()[:3]))

    def on_begin(conn: Any) -> None:
        sent.append("BEGIN")

    def on_commit(conn: Any) -> None:
        sent.append("COMMIT")

    svc = service(db, CreatePolicy())  # the default quotas: active, per day, per month
    await svc.create(request(target_id="warm-up"))
    listeners = [
        ("before_cursor_execute", on_statement),
        ("begin", on_begin),
        ("commit", on_commit),
    ]
    for name, fn in listeners:
        event.listen(engine, name, fn)
    try:
        await svc.create(request(target_id="counted"))
    finally:
        for name, fn in listeners:
            event.remove(engine, name, fn)
    assert len(sent) == 6, sent
    assert sent[0] == "BEGIN" and sent[-1] == "COMMIT"
