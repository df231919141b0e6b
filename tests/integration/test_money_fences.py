"""Money that cannot leak, on the real PostgreSQL: an admin retry reserves against the OWNER's
quotas and budgets like a create (refused past them unless overridden) under the original's own
credential choice; EXECUTE's attempts are fenced by their own lock token (a taken-over attempt
neither calls the provider nor stores its late answer); a usage row written twice is one row."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import text

from db import attempts as attempts_db
from db import credentials as credentials_db
from db import endings as endings_db
from db import lifecycle as lifecycle_db
from db import usage as usage_db
from db.attempts import Settlement
from db.session import SessionMaker
from db.usage import UsageRow
from engine.errors import JobNotRetryable, QuotaExceeded, public_message_for
from jobs import attempt_start, calls
from jobs.service import CreateJobRequest, CreatePolicy, JobService
from jobs.types import default_catalog

QUIZ = {"sourceText": "Photosynthesis happens in chloroplasts. " * 20, "count": 3}
PRICED = CreatePolicy(
    max_active_jobs=0, max_jobs_per_day=0, model="deepseek-chat", platform_synthetic=False
)


def service(sm: SessionMaker, **policy: Any) -> JobService:
    return JobService(sm, default_catalog(), dataclasses.replace(PRICED, **policy))


async def failed_quiz(svc: JobService, sm: SessionMaker, user_id: str) -> uuid.UUID:
    """A quiz job of `user_id`, failed as an outage leaves it."""
    job = (
        await svc.create(
            CreateJobRequest(
                user_id=user_id,
                job_type="quiz_generation",
                target_type="test",
                target_id="t1",
                input=QUIZ,
            )
        )
    ).job
    async with sm.begin() as s:
        await lifecycle_db.lock(s, job.id, owner=f"w-{job.id}", identity="t", ttl_s=60)
        code = "PROVIDER_UNAVAILABLE"
        await endings_db.mark_failed(s, job.id, code, public_message_for(code), "test")
    return job.id


def usage(job_id: uuid.UUID, user_id: str, cost: Decimal, **kw: Any) -> UsageRow:
    return UsageRow(
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
        **kw,
    )


# ---- retries go through the owner's budgets ------------------------------------------------


async def test_a_retry_past_the_owners_budget_is_refused_unless_overridden(
    db: SessionMaker,
) -> None:
    svc = service(db, max_cost_usd_per_day=Decimal("0.05"))
    original = await failed_quiz(svc, db, "owner")
    # The owner's day is spent: the failed job's call cost the whole budget.
    async with db.begin() as s:
        await usage_db.insert(s, usage(original, "owner", Decimal("0.05")))
    with pytest.raises(QuotaExceeded) as refused:
        await svc.retry(original)
    assert refused.value.retry_after_s, "a refusal says when to come back"
    async with db() as s:
        n = (
            await s.execute(
                text("SELECT count(*) FROM ai_job WHERE retried_from_job_id = :id"),
                {"id": original},
            )
        ).scalar_one()
    assert n == 0, "a refused retry created a job"
    # The admin's override creates it past the budget, once.
    retried = await svc.retry(original, override_budget=True)
    assert retried.created and retried.job.retried_from_job_id == original
    again = await svc.retry(original)
    assert not again.created and again.job.id == retried.job.id


async def test_a_retry_counts_against_the_owners_job_quota(db: SessionMaker) -> None:
    svc = service(db, max_jobs_per_day=1)
    original = await failed_quiz(svc, db, "quota-owner")
    with pytest.raises(QuotaExceeded):
        await svc.retry(original)
    # Another user's quota is not the owner's: the retry is the owner's job.
    assert (await svc.retry(original, override_budget=True)).created


async def test_a_retry_keeps_the_originals_own_key_not_the_newest(db: SessionMaker) -> None:
    svc = JobService(
        db, default_catalog(), PRICED, credential_lookup=credentials_db.active_user_key_id
    )
    async with db.begin() as s:
        keys = [
            await credentials_db.add(
                s, user_id="keyed", provider="deepseek", key_id="k1", ciphertext=b"x", key_hint=h
            )
            for h in ("...aaaa", "...bbbb", "...cccc")
        ]
    own, _newer, revoked_later = keys

    async def failed_with(key: uuid.UUID) -> uuid.UUID:
        job = (
            await svc.create(
                CreateJobRequest(
                    user_id="keyed",
                    job_type="quiz_generation",
                    target_type="test",
                    target_id="t1",
                    input=QUIZ,
                    credential_mode="user_deepseek_key",
                    credential_id=key,
                )
            )
        ).job
        async with db.begin() as s:
            await lifecycle_db.lock(s, job.id, owner=f"w-{job.id}", identity="t", ttl_s=60)
            await endings_db.mark_failed(s, job.id, "TIMEOUT", public_message_for("TIMEOUT"), "t")
        return job.id

    first = await failed_with(own.id)
    retried = (await svc.retry(first)).job
    assert (retried.credential_mode, retried.credential_id) == ("user_deepseek_key", own.id)
    second = await failed_with(revoked_later.id)
    async with db.begin() as s:
        assert await credentials_db.revoke(s, "keyed", revoked_later.id)
    with pytest.raises(JobNotRetryable):
        await svc.retry(second)


# ---- usage rows: one identity each -----------------------------------------------------------


async def test_a_usage_row_written_twice_is_one_row_charged_once(db: SessionMaker) -> None:
    svc = service(db)
    job_id = await failed_quiz(svc, db, "twice")
    row = usage(job_id, "twice", Decimal("0.01"), call_no=7)
    for _ in range(2):  # the retry of a commit whose answer was lost
        async with db.begin() as s:
            await usage_db.insert(s, row)
    async with db() as s:
        logged = (
            await s.execute(
                text("SELECT count(*) FROM ai_usage_log WHERE job_id = :id"), {"id": job_id}
            )
        ).scalar_one()
        spent = (
            await s.execute(
                text("SELECT spent_cost_usd FROM ai_job WHERE id = :id"), {"id": job_id}
            )
        ).scalar_one()
        calls_rolled = (
            await s.execute(text("SELECT sum(calls) FROM ai_usage_daily WHERE user_id = 'twice'"))
        ).scalar_one()
    assert (logged, spent, calls_rolled) == (1, Decimal("0.01"), 1)
    # Another call of the same attempt is its own row.
    async with db.begin() as s:
        await usage_db.insert(s, dataclasses.replace(row, call_no=8))
    async with db() as s:
        logged = (
            await s.execute(
                text("SELECT count(*) FROM ai_usage_log WHERE job_id = :id"), {"id": job_id}
            )
        ).scalar_one()
    assert logged == 2


# ---- fenced attempts ---------------------------------------------------------------------------


class CountingProvider:
    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, req: Any) -> Any:
        self.calls += 1
        return "answer"


def start_of(job_id: uuid.UUID, attempt: int) -> attempt_start.Start:
    return attempt_start.Start(
        job_id, f"wf:{job_id}", "worker-1", 60, "run-1", None, attempt, 30_000
    )


async def take(db: SessionMaker, st: attempt_start.Start) -> int | None:
    async with db.begin() as s:
        taken = await attempts_db.take(
            s, st.job_id, owner=st.owner, identity=st.attempt_identity, ttl_s=60, run_id=st.run_id
        )
    assert taken is not None
    return taken.call_no


def settlement(st: attempt_start.Start, call_no: int | None, user_id: str) -> Settlement:
    out = {"attempt": st.attempt}
    return Settlement(
        usage=usage(st.job_id, user_id, Decimal("0.001"), call_no=call_no),
        gate=None,
        limits=None,
        job_id=st.job_id,
        owner=st.owner,
        attempt=st.attempt,
        ttl_s=60,
        output=out,
        output_hash=f"hash-{st.attempt}",
        token=st.token,
    )


async def test_a_taken_over_attempt_neither_calls_nor_stores_its_answer(db: SessionMaker) -> None:
    svc = service(db)
    job = (
        await svc.create(
            CreateJobRequest(
                user_id="racer",
                job_type="quiz_generation",
                target_type="test",
                target_id="t1",
                input=QUIZ,
            )
        )
    ).job
    first, second = start_of(job.id, 1), start_of(job.id, 2)
    # Both attempts take the job at once (the first is the one Temporal gave up on): the row
    # lock orders them, the later one takes over, and each call gets its own number.
    numbers = await asyncio.gather(take(db, first), take(db, second))
    assert sorted(n for n in numbers if n is not None) == [1, 2]
    async with db() as s:
        holder = (
            await s.execute(text("SELECT locked_by FROM ai_job WHERE id = :id"), {"id": job.id})
        ).scalar_one()
    owner_st, loser_st = (second, first) if holder == second.token else (first, second)
    assert holder == owner_st.token
    assert await attempt_start.holds(db, owner_st.fence, ttl_s=60)
    assert not await attempt_start.holds(db, loser_st.fence, ttl_s=60)

    provider = CountingProvider()

    async def call_as(st: attempt_start.Start) -> Any:
        async def still_ours() -> bool:
            return await attempt_start.holds(db, st.fence, ttl_s=60)

        return await calls.call(
            provider,
            None,  # type: ignore[arg-type]
            timeout_s=5,
            beat=lambda: None,
            beat_interval_s=1,
            still_ours=still_ours,
            check_every_s=1,
            check_first=True,
        )

    with pytest.raises(calls.SelfCancelled):
        await call_as(loser_st)
    assert provider.calls == 0, "a taken-over attempt reached the provider"
    assert await call_as(owner_st) == "answer" and provider.calls == 1

    # Both answers settle concurrently: the loser's is charged but never the job's output.
    loser_no = numbers[0] if loser_st is first else numbers[1]
    owner_no = numbers[1] if loser_st is first else numbers[0]
    late, mine = await asyncio.gather(
        attempts_db.settle(db, settlement(loser_st, loser_no, "racer")),
        attempts_db.settle(db, settlement(owner_st, owner_no, "racer")),
    )
    assert not late.owned and mine.owned
    async with db() as s:
        stored = (
            await s.execute(text("SELECT output_hash FROM ai_job WHERE id = :id"), {"id": job.id})
        ).scalar_one()
        logged = (
            await s.execute(
                text("SELECT count(*) FROM ai_usage_log WHERE job_id = :id"), {"id": job.id}
            )
        ).scalar_one()
    assert stored == f"hash-{owner_st.attempt}"
    assert logged == 2, "every call that was paid is charged"
    # The owner's settlement retried (its commit's answer lost): no second row, same output.
    again = await attempts_db.settle(db, settlement(owner_st, owner_no, "racer"))
    assert again.owned
    async with db() as s:
        logged = (
            await s.execute(
                text("SELECT count(*) FROM ai_usage_log WHERE job_id = :id"), {"id": job.id}
            )
        ).scalar_one()
    assert logged == 2
