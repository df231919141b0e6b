"""Budgets that hold under concurrency, per-job caps and quotes, on the real PostgreSQL.

A create reserves its job's worst-case cost (jobs/costs.py) against the user's budgets in the
create transaction (db/budgets.py); spend plus open reservations never exceed a budget however
many creates race; a job that ends gives back what it did not spend; a call after a paid one
is reserved first (EXECUTE's `cover_next_call`)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import text

from db import budgets as budgets_db
from db import usage as usage_db
from db.session import SessionMaker
from db.usage import UsageRow
from engine.errors import CostCapTooLow, IdempotencyKeyReused, QuotaExceeded
from jobs import lifecycle
from jobs.costs import (
    RESERVATIONS_RETRY_AFTER_S,
    budget_windows,
    call_worst_case_usd,
    cover_next_call,
)
from jobs.service import CreateJobRequest, CreatePolicy, JobService
from jobs.types import default_catalog
from providers.pricing import PriceTable

QUIZ = {"sourceText": "Photosynthesis happens in chloroplasts. " * 20, "count": 3}
PRICED = CreatePolicy(
    max_active_jobs=0,
    max_jobs_per_day=0,
    model="deepseek-chat",
    platform_synthetic=False,
)


def service(sm: SessionMaker, **policy: Any) -> JobService:
    return JobService(sm, default_catalog(), dataclasses.replace(PRICED, **policy))


def quiz(user_id: str = "u1", target: str = "t1", **kw: Any) -> CreateJobRequest:
    return CreateJobRequest(
        user_id=user_id,
        job_type="quiz_generation",
        target_type="test",
        target_id=target,
        input=QUIZ,
        **kw,
    )


def usd(value: Decimal) -> Decimal:
    return value.quantize(Decimal("0.00000001"))


async def reserved_open(sm: SessionMaker, user_id: str) -> Decimal:
    async with sm() as s:
        return (await budgets_db.standing(s, user_id, reserved=True)).reserved_usd


async def spend(sm: SessionMaker, job_id: uuid.UUID, user_id: str, cost: Decimal) -> None:
    """One paid call of the job, written as EXECUTE writes it (log, rollup, job spend)."""
    async with sm.begin() as s:
        await usage_db.insert(
            s,
            UsageRow(
                job_id=job_id,
                user_id=user_id,
                job_type="quiz_generation",
                attempt_no=1,
                credential_mode="platform_key",
                provider="deepseek",
                model="deepseek-chat",
                tokens_in=100,
                tokens_out=100,
                cost_usd=cost,
                latency_ms=1,
                error_code=None,
            ),
        )


async def test_the_estimate_is_stored_with_the_job_and_priced_at_the_model(
    db: SessionMaker,
) -> None:
    svc = service(db)
    quoted = (await svc.quote(quiz())).checked.estimate
    job = (await svc.create(quiz())).job
    assert job.estimated_input_tokens == quoted.input_tokens > 0
    assert job.max_output_tokens == quoted.output_budget == 4096
    assert job.reserved_cost_usd == quoted.worst_case_cost_usd > quoted.estimated_cost_usd > 0
    price = PriceTable().price_for("deepseek-chat")
    # The worst case: the prompt with its 25 % margin plus the whole answer budget.
    assert quoted.worst_case_cost_usd == call_worst_case_usd(
        quoted.input_tokens, 4096, price=price, margin=0.25
    )
    # The synthetic provider's calls are free: nothing to reserve.
    free = await service(db, platform_synthetic=True).create(quiz(target="t2"))
    assert free.job.reserved_cost_usd == 0


async def test_concurrent_creates_never_reserve_past_the_daily_budget(db: SessionMaker) -> None:
    probe = service(db)
    worst = (await probe.quote(quiz())).checked.estimate.worst_case_cost_usd
    budget = worst * 5 + worst / 2  # room for five jobs, not six
    svc = service(db, max_cost_usd_per_day=float(budget))
    results = await asyncio.gather(
        *(svc.create(quiz(target=f"t{i}")) for i in range(30)), return_exceptions=True
    )
    admitted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(admitted) == 5
    assert all(isinstance(r, QuotaExceeded) for r in refused), refused[:1]
    assert {r.retry_after_s for r in refused if isinstance(r, QuotaExceeded)} == {
        RESERVATIONS_RETRY_AFTER_S
    }
    assert await reserved_open(db, "u1") == worst * 5 <= budget
    # Another user's budget is their own.
    assert (await svc.create(quiz("u2"))).created


async def test_an_ended_job_gives_back_what_it_did_not_spend(db: SessionMaker) -> None:
    worst = (await service(db).quote(quiz())).checked.estimate.worst_case_cost_usd
    svc = service(db, max_cost_usd_per_day=float(worst * 5 / 2))
    first = (await svc.create(quiz(target="a"))).job
    await svc.create(quiz(target="b"))
    with pytest.raises(QuotaExceeded):
        await svc.create(quiz(target="c"))
    # The first job's call cost a tenth of its worst case, then it ended.
    tenth = usd(worst / 10)
    await spend(db, first.id, "u1", tenth)
    async with db.begin() as s:
        await lifecycle.cancel(s, first.id, only_if_queued=True)
    async with db() as s:
        today = dt.datetime.now(dt.UTC).date()
        held = (await budgets_db.standing(s, "u1", spent_since=[today], reserved=True)).committed(0)
    assert held.spent_usd == tenth
    assert held.reserved_usd == worst  # only the second job's
    assert (await svc.create(quiz(target="c"))).created


async def test_spend_alone_past_the_budget_waits_for_the_next_window(db: SessionMaker) -> None:
    svc = service(db, max_cost_usd_per_day=0.01)
    job = (await service(db).create(quiz(target="x"))).job
    await spend(db, job.id, "u1", Decimal("0.01"))
    async with db.begin() as s:
        await lifecycle.cancel(s, job.id, only_if_queued=True)
    with pytest.raises(QuotaExceeded) as info:
        await svc.create(quiz())
    now = dt.datetime.now(dt.UTC)
    midnight = (now + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    assert info.value.retry_after_s is not None
    assert abs(info.value.retry_after_s - (midnight - now).total_seconds()) <= 5
    assert "daily" in info.value.public_message


async def test_a_cost_cap_cuts_the_answer_budget_and_a_cap_too_low_is_refused(
    db: SessionMaker,
) -> None:
    svc = service(db)
    full = (await svc.quote(quiz())).checked.estimate
    # A cap as a client sends it: at most 8 decimal places, what the column keeps.
    cap = (full.worst_case_cost_usd / 2).quantize(Decimal("0.00000001"))
    job = (await svc.create(quiz(max_cost_usd=cap))).job
    assert job.max_cost_usd == cap
    assert job.max_output_tokens is not None and 256 <= job.max_output_tokens < 4096
    assert job.reserved_cost_usd <= cap
    with pytest.raises(CostCapTooLow) as info:
        await svc.create(quiz(target="t2", max_cost_usd=Decimal("0.00000100")))
    assert "maxCostUsd" in info.value.public_message
    async with db() as s:
        n = (await s.execute(text("SELECT count(*) FROM ai_job"))).scalar_one()
    assert n == 1
    # The cap is part of the request: the same key with another cap is another request.
    await svc.create(quiz(target="k", idempotency_key="key-1", max_cost_usd=cap))
    with pytest.raises(IdempotencyKeyReused):
        await svc.create(quiz(target="k", idempotency_key="key-1", max_cost_usd=cap * 2))


async def test_a_quote_writes_nothing_and_names_the_limit_that_refuses(db: SessionMaker) -> None:
    worst = (await service(db).quote(quiz())).checked.estimate.worst_case_cost_usd
    svc = service(db, max_cost_usd_per_day=float(worst * 3 / 2))
    ok = await svc.quote(quiz())
    assert ok.refusal is None
    await svc.create(quiz())
    q = await svc.quote(quiz(target="t2"))
    assert q.refusal is not None and q.refusal.limit == "daily_cost_budget"
    assert q.refusal.error.retry_after_s == RESERVATIONS_RETRY_AFTER_S
    [(window, held)] = q.budgets
    assert window.name == "daily" and held.reserved_usd == worst
    async with db() as s:
        rows = (await s.execute(text("SELECT count(*) FROM ai_job"))).scalar_one()
    assert rows == 1
    with pytest.raises(QuotaExceeded):  # and a create now is indeed refused
        await svc.create(quiz(target="t2"))


async def test_a_call_after_a_paid_one_is_reserved_first_or_refused(db: SessionMaker) -> None:
    svc = service(db)
    job = (await svc.create(quiz())).job
    worst = job.reserved_cost_usd
    paid = usd(worst / 4)
    await spend(db, job.id, "u1", paid)  # the first attempt's answer was paid, then invalid
    now = dt.datetime.now(dt.UTC)

    async def cover(windows_usd: float = 0.0, cap: Decimal | None = None) -> str | None:
        async with db.begin() as s:
            row = (
                await s.execute(
                    text("SELECT reserved_cost_usd, spent_cost_usd FROM ai_job WHERE id = :id"),
                    {"id": job.id},
                )
            ).one()
            return await cover_next_call(
                s,
                job_id=job.id,
                user_id="u1",
                reserved_usd=row.reserved_cost_usd,
                spent_usd=row.spent_cost_usd,
                max_cost_usd=cap,
                call_worst_usd=worst,
                windows=budget_windows(windows_usd, 0.0, now),
            )

    # A cap below spent + another worst case stops the job; nothing is reserved.
    assert await cover(cap=worst) == "cap"
    # A budget that cannot hold another worst case on top of what was spent stops it too.
    assert await cover(windows_usd=float(worst)) == "daily"
    assert await reserved_open(db, "u1") == worst - paid
    # With room, the reservation grows to spent + one more worst case.
    assert await cover(windows_usd=float(worst * 3)) is None
    assert await reserved_open(db, "u1") == worst
    async with db() as s:
        reserved = (
            await s.execute(
                text("SELECT reserved_cost_usd FROM ai_job WHERE id = :id"), {"id": job.id}
            )
        ).scalar_one()
    assert reserved == paid + worst
