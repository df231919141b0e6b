"""Budgets above the user on the real PostgreSQL: an organisation's, a team's and a tag's.

Creates of many users racing on one scope never reserve past its budget (the budget rows are
locked in one order inside the create's transaction); a reservation grows only if every scope
holds it; a usage row of a scoped job raises each scope's day, and its alerts are decided in
that row's transaction, once per threshold and period, however many usage rows race; a job
with no scope costs the create and the usage write no statement."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import event, text

from db import scope_budgets as scope_budgets_db
from db import usage as usage_db
from db.session import SessionMaker
from db.usage import UsageRow
from db.webhooks import ADMIN_OWNER
from engine.errors import QuotaExceeded
from engine.schedules import Spec
from engine.scopes import JobScopes
from jobs import lifecycle, scope_budgets
from jobs.costs import RESERVATIONS_RETRY_AFTER_S, cover_next_call
from jobs.schedules import NewSchedule, SchedulePolicy, ScheduleService
from jobs.service import CreateJobRequest, CreatePolicy, JobService
from jobs.types import default_catalog
from tests.integration.engine_helpers import rows, scalar
from tests.webhook_helpers import service as webhook_service

QUIZ = {"sourceText": "Photosynthesis happens in chloroplasts. " * 20, "count": 3}
PRICED = CreatePolicy(
    max_active_jobs=0,
    max_jobs_per_day=0,
    max_jobs_per_month=0,
    model="deepseek-chat",
    platform_synthetic=False,
)
CLASS_A = JobScopes("school-1", ("class-a",))


def jobs(sm: SessionMaker, **policy: Any) -> JobService:
    return JobService(sm, default_catalog(), dataclasses.replace(PRICED, **policy))


def quiz(user: str = "u1", scopes: JobScopes = CLASS_A, **kw: Any) -> CreateJobRequest:
    return CreateJobRequest(
        user_id=user,
        job_type="quiz_generation",
        target_type="test",
        target_id=kw.pop("target", f"t-{uuid.uuid4().hex[:8]}"),
        input=QUIZ,
        scopes=scopes,
        **kw,
    )


async def put(sm: SessionMaker, scope: str, scope_id: str, limit: Decimal, **kw: Any) -> None:
    async with sm.begin() as s:
        await scope_budgets_db.put(
            s,
            scope,
            scope_id,
            limit_usd=limit,
            period=kw.get("period", "day"),
            alert_at=[Decimal(str(a)) for a in kw.get("alert_at", [])],
        )


async def holding(sm: SessionMaker, scope: str, scope_id: str) -> scope_budgets.ScopeHolding:
    async with sm() as s:
        row = await scope_budgets_db.get(s, scope, scope_id)
        assert row is not None
        (held,) = await scope_budgets.holding(s, [row], dt.datetime.now(dt.UTC))
    return held


async def charge(sm: SessionMaker, job_id: uuid.UUID, user: str, cost: Decimal, n: int) -> None:
    """A paid call of the job, written as EXECUTE writes it (one statement)."""
    async with sm.begin() as s:
        await usage_db.insert(
            s,
            UsageRow(
                job_id=job_id,
                user_id=user,
                job_type="quiz_generation",
                attempt_no=1,
                credential_mode="platform_key",
                provider="deepseek",
                model="deepseek-chat",
                tokens_in=10,
                tokens_out=10,
                cost_usd=cost,
                latency_ms=1,
                error_code=None,
                call_no=n,
            ),
        )


def usd(value: Decimal) -> Decimal:
    return value.quantize(Decimal("0.00000001"))


async def worst_case(sm: SessionMaker) -> Decimal:
    return (await jobs(sm).quote(quiz(scopes=JobScopes()))).checked.estimate.worst_case_cost_usd


async def test_thirty_racing_creates_of_three_users_never_reserve_past_a_team_budget(
    db: SessionMaker,
) -> None:
    worst = await worst_case(db)
    await put(db, "team", "class-a", usd(worst * 11 / 2))  # room for five jobs, not six
    svc = jobs(db)
    users = [f"u{i % 3}" for i in range(30)]
    results = await asyncio.gather(*(svc.create(quiz(u)) for u in users), return_exceptions=True)
    admitted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(admitted) == 5, [type(r).__name__ for r in refused]
    for r in refused:
        assert isinstance(r, QuotaExceeded), r
        assert r.problem_extra == {"scope": "team", "scopeId": "class-a", "period": "day"}
        assert r.retry_after_s == RESERVATIONS_RETRY_AFTER_S  # reservations hold the room
    held = await holding(db, "team", "class-a")
    assert held.held.reserved_usd == worst * 5 and held.held.spent_usd == 0
    # Another team, or no scope at all, is not this budget's business.
    assert (await svc.create(quiz(scopes=JobScopes("school-1", ("class-b",))))).created
    assert (await svc.create(quiz(scopes=JobScopes()))).created
    # A job that ends gives back what it did not spend: room for one more.
    first, quarter = admitted[0].job, usd(worst / 4)
    await charge(db, first.id, first.user_id, quarter, 1)
    async with db.begin() as s:
        await lifecycle.cancel(s, first.id, only_if_queued=True)
    held = await holding(db, "team", "class-a")
    assert (held.held.spent_usd, held.held.reserved_usd) == (quarter, worst * 4)
    assert (await svc.create(quiz("u9"))).created
    with pytest.raises(QuotaExceeded):
        await svc.create(quiz("u9"))


async def test_a_tag_budget_refuses_only_its_tag_and_a_quote_names_it(db: SessionMaker) -> None:
    worst = await worst_case(db)
    await put(db, "tag", "unit-1", usd(worst * 3 / 2), period="month")
    svc = jobs(db)
    tagged = JobScopes(tags=("unit-1", "extra"))
    assert (await svc.create(quiz(scopes=tagged))).created
    q = await svc.quote(quiz(scopes=tagged))
    assert q.refusal is not None and q.refusal.limit == "scope_budget"
    named = getattr(q.refusal.error, "problem_extra", None)
    assert named == {"scope": "tag", "scopeId": "unit-1", "period": "month"}
    [budget] = q.scope_budgets
    assert (budget.budget.scope_id, budget.held.reserved_usd) == ("unit-1", worst)
    with pytest.raises(QuotaExceeded):
        await svc.create(quiz(scopes=tagged))
    assert (await svc.create(quiz(scopes=JobScopes(tags=("extra",))))).created
    # Deleted, the budget no longer applies.
    async with db.begin() as s:
        assert await scope_budgets_db.delete(s, "tag", "unit-1")
    assert (await svc.create(quiz(scopes=tagged))).created


async def test_a_reservation_grows_only_if_every_scope_holds_it(db: SessionMaker) -> None:
    worst = await worst_case(db)
    job, half = (await jobs(db).create(quiz())).job, usd(worst / 2)
    await charge(db, job.id, "u1", half, 1)  # the first answer was paid, then invalid

    async def cover() -> str | None:
        async with db.begin() as s:
            row = (
                await s.execute(
                    text("SELECT reserved_cost_usd, spent_cost_usd FROM ai_job WHERE id = :id"),
                    {"id": job.id},
                )
            ).one()

            async def scopes_hold(grow: Decimal) -> str | None:
                return await scope_budgets.refusal_to_grow(s, CLASS_A, job.id, grow)

            return await cover_next_call(
                s,
                job_id=job.id,
                user_id="u1",
                reserved_usd=row.reserved_cost_usd,
                spent_usd=row.spent_cost_usd,
                max_cost_usd=None,
                call_worst_usd=worst,
                windows=[],
                scopes_refusal=scopes_hold,
            )

    # The organisation's budget cannot hold what was spent plus another worst case.
    await put(db, "org", "school-1", usd(worst * 5 / 4), period="month")
    assert await cover() == "org"
    assert await scalar(db, "SELECT reserved_cost_usd FROM ai_job WHERE id = :id", id=job.id) == (
        worst
    )
    await put(db, "org", "school-1", worst * 2, period="month")
    assert await cover() is None
    reserved = await scalar(db, "SELECT reserved_cost_usd FROM ai_job WHERE id = :id", id=job.id)
    assert reserved == half + worst


async def test_alerts_go_out_once_per_threshold_however_many_usage_rows_race(
    db: SessionMaker,
) -> None:
    await put(db, "org", "school-1", Decimal(1), period="month", alert_at=[0.25, 0.5, 0.9])
    admin_hook, _ = await webhook_service(db).create(
        ADMIN_OWNER, "http://127.0.0.1:9/admin", ["ai.budget.threshold_crossed"]
    )
    user_hook, _ = await webhook_service(db).create("u1", "http://127.0.0.1:9/user", None)
    job = (await jobs(db).create(quiz())).job
    await charge(db, job.id, "u1", Decimal("0.2"), 1)
    assert await alerts(db) == []
    # Ten calls of 0.05 racing: the spend goes 0.2 -> 0.7, past 0.25 and 0.5 once each.
    await asyncio.gather(*(charge(db, job.id, "u1", Decimal("0.05"), n) for n in range(2, 12)))
    sent = await alerts(db)
    assert [a["threshold"] for a in sent] == [0.25, 0.5]
    first = sent[0]
    assert first["scope"] == "org" and first["scopeId"] == "school-1"
    assert first["period"] == "month" and first["limitUsd"] == "1.00000000"
    assert first["periodStart"] == dt.datetime.now(dt.UTC).date().replace(day=1).isoformat()
    assert Decimal("0.25") <= Decimal(first["spentUsd"]) < Decimal("0.5")
    # Each event went to the admin webhook only, as a pending delivery.
    deliveries = await rows(db, "SELECT endpoint_id, status, event_type FROM webhook_delivery")
    assert {(d.endpoint_id, d.status) for d in deliveries} == {(admin_hook.id, "pending")}
    assert len(deliveries) == 2 and user_hook.id not in {d.endpoint_id for d in deliveries}
    # A PUT sends nothing; a threshold passed before it goes at the next usage row, once; those
    # already sent this period never again.
    await put(db, "org", "school-1", Decimal(1), period="month", alert_at=[0.25, 0.5, 0.6, 0.9])
    assert len(await alerts(db)) == 2
    await charge(db, job.id, "u1", Decimal("0.01"), 20)
    await charge(db, job.id, "u1", Decimal("0.01"), 21)
    assert [a["threshold"] for a in await alerts(db)] == [0.25, 0.5, 0.6]


async def alerts(sm: SessionMaker) -> list[dict[str, Any]]:
    found = await rows(
        sm,
        "SELECT payload FROM outbox_event WHERE event_type = 'ai.budget.threshold_crossed' "
        "ORDER BY id",
    )
    return [dict(r.payload) for r in found]


async def test_a_job_without_scopes_costs_no_statement_even_where_scope_budgets_exist(
    db: SessionMaker,
) -> None:
    """Counted as PostgreSQL sees them: a plain job's create is BEGIN, its INSERT, its
    snapshot and enqueue row, COMMIT (no quota: none configured), budgets of other scopes
    notwithstanding; its usage row is one statement that writes no scope row. A scoped job on
    a scope without a budget reads the budgets once."""
    await put(db, "team", "class-a", Decimal(100))
    await put(db, "org", "school-1", Decimal(100))
    svc = jobs(db)
    await svc.create(quiz(target="warm-up", scopes=JobScopes()))
    plain = await counted(db, svc.create(quiz(scopes=JobScopes())))
    assert len(plain) == 4, plain
    scoped_elsewhere = await counted(db, svc.create(quiz(scopes=JobScopes("school-2"))))
    assert len(scoped_elsewhere) == 5 and "FOR UPDATE" in " ".join(scoped_elsewhere)
    job = (await svc.create(quiz(scopes=JobScopes()))).job
    usage = await counted(db, charge(db, job.id, "u1", Decimal("0.01"), 1))
    assert len(usage) == 3, usage  # BEGIN, the usage statement, COMMIT
    assert await scalar(db, "SELECT count(*) FROM ai_scope_usage_daily") == 0
    assert await scalar(db, "SELECT count(*) FROM ai_usage_scoped_daily") == 0


async def counted(sm: SessionMaker, work: Any) -> list[str]:
    engine: Any = sm().bind.sync_engine  # type: ignore[union-attr]
    sent: list[str] = []

    def on_statement(*args: Any) -> None:
        sent.append(" ".join(str(args[2]).split()))

    def on_begin(conn: Any) -> None:
        sent.append("BEGIN")

    def on_commit(conn: Any) -> None:
        sent.append("COMMIT")

    listeners = [
        ("before_cursor_execute", on_statement),
        ("begin", on_begin),
        ("commit", on_commit),
    ]
    for name, fn in listeners:
        event.listen(engine, name, fn)
    try:
        await work
    finally:
        for name, fn in listeners:
            event.remove(engine, name, fn)
    return sent


async def test_retries_and_a_schedules_runs_keep_their_scopes(db: SessionMaker) -> None:
    svc = jobs(db)
    scoped = JobScopes("school-1", ("class-a", "class-b"), ("unit-1",))
    original = (await svc.create(quiz(scopes=scoped))).job
    assert (original.org_id, original.team_ids, original.tags) == (
        "school-1",
        ["class-a", "class-b"],
        ["unit-1"],
    )
    async with db.begin() as s:
        await lifecycle.cancel(s, original.id, only_if_queued=True)
    retry = (await svc.retry(original.id, owner="u1")).job
    assert (retry.org_id, retry.team_ids, retry.tags) == (
        original.org_id,
        original.team_ids,
        original.tags,
    )
    # A scope budget refuses the retry as it would a create, unless an admin overrides it.
    async with db.begin() as s:
        await lifecycle.cancel(s, retry.id, only_if_queued=True)
    await put(db, "tag", "unit-1", Decimal("0.00000001"))
    with pytest.raises(QuotaExceeded):
        await svc.retry(retry.id)
    assert (await svc.retry(retry.id, override_budget=True)).job.tags == ["unit-1"]
    # A schedule keeps its creator's organisation and teams and its template's tags.
    schedules = ScheduleService(db, svc, SchedulePolicy(min_interval_s=60, max_per_user=10))
    row = await schedules.create(
        NewSchedule(
            user_id="u1",
            job_type="quiz_generation",
            input=QUIZ,
            spec=Spec(3600, None),
            scopes=JobScopes("school-1", ("class-c",), ("unit-2",)),
        )
    )
    ran = await schedules.run(row.id, dt.datetime.now(dt.UTC), manual=True)
    assert ran.job_id is not None, ran
    job = await scalar(
        db, "SELECT array[org_id] || team_ids || tags FROM ai_job WHERE id = :id", id=ran.job_id
    )
    assert job == ["school-1", "class-c", "unit-2"]
