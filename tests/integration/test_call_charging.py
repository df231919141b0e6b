"""Every call the engine sent is charged, and a reservation bounds what a job costs, on the real
stack against the fake OpenAI-compatible server over HTTP (jobs/charging.py, docs/money.md):

- a job cancelled while the provider is still answering ends cancelled with its one call
  charged `estimated` at the quote's worst case, counted by the usage API and by the budget;
- a call stopped by the job's timeout is charged the same way;
- an echoed model id the price table does not know is priced as the requested model, so
  concurrent creates against a budget never spend past it;
- cached prompt tokens and reasoning tokens are reported per call and priced by the table.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

from sqlalchemy import text
from temporalio.client import Client

from db import budgets as budgets_db
from db.session import SessionMaker
from engine.errors import QuotaExceeded
from jobs.service import CreateJobRequest, CreatePolicy, JobService
from jobs.types import default_catalog
from jobs.types import quiz_generation as quiz
from providers.pricing import PriceTable
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import workflow_canceller
from tests.integration.provider_helpers import api_client, auth, fake_env, usage_rows
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, Stack, catalog_with, engine_stack, make_settings, variant
from tests.support import eventually

QUIZ = "quiz_generation"
QUIZ_LONG = variant(quiz.JOB, "test_quiz_charged_long", timeout_ms=60_000, max_retries=0)
QUIZ_SHORT = variant(
    quiz.JOB, "test_quiz_charged_short", timeout_ms=1000, max_retries=0, backoff_ms=500
)
CATALOG = catalog_with(QUIZ_LONG, QUIZ_SHORT)
VALID = {"kind": "valid", "content": SCRIPTED[QUIZ]}
PRICES = PriceTable(warn=False)


def _settings(database_url: str, temporal_address: str, fake: FakeOpenAIServer, **env: Any) -> Any:
    return make_settings(database_url, temporal_address, **fake_env(fake, **env))


def _worst(row: Any) -> Decimal:
    """The quote's worst case of a one-call job, from what create stored."""
    return PRICES.worst_case_cost(
        "deepseek-chat", row.estimated_input_tokens, row.max_output_tokens, 0.25
    )


async def _spent_today(sm: SessionMaker, user_id: str) -> Decimal:
    async with sm() as s:
        today = dt.datetime.now(dt.UTC).date()
        held = await budgets_db.standing(s, user_id, spent_since=[today])
    return held.committed(0).spent_usd


async def _job_usage(settings: Any, job_id: uuid.UUID, user: str = "u1") -> dict[str, Any]:
    async with api_client(settings) as (_, c):
        r = await c.get(f"/api/ai/jobs/{job_id}/usage", headers=auth(settings, user))
        assert r.status_code == 200, r.text
        own = await c.get("/api/ai/usage", headers=auth(settings, user))
        assert own.status_code == 200, own.text
    body: dict[str, Any] = r.json()
    body["own_total"] = own.json()["total"]
    return body


async def _assert_charged_worst_case(stack: Stack, job_id: uuid.UUID) -> Decimal:
    row = await stack.job(job_id)
    [u] = await usage_rows(stack, job_id)
    worst = _worst(row)
    assert worst > 0 and worst == row.reserved_cost_usd
    assert (u.cost_basis, u.cost_usd, u.priced_as) == ("estimated", worst, "deepseek-chat")
    assert u.tokens_out == row.max_output_tokens
    body = await _job_usage(stack.settings, job_id)
    [attempt] = body["attempts"]
    [call] = attempt["providerCalls"]
    assert call["costBasis"] == "estimated" and Decimal(call["costUsd"]) == worst
    assert call["pricedAs"] == "deepseek-chat" and call["model"] == "deepseek-chat"
    assert Decimal(body["costUsd"]) == Decimal(body["estimatedCostUsd"]) == worst
    assert Decimal(attempt["estimatedCostUsd"]) == worst
    assert Decimal(body["own_total"]["estimatedCostUsd"]) == worst
    # The budget counts it: the day's spend is the charge.
    assert await _spent_today(stack.parts.sessionmaker, "u1") == worst
    return worst


async def test_a_job_cancelled_while_the_provider_answers_is_charged_its_worst_case(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    await fake.ascript([{"kind": "slow", "delay_s": 30, "content": SCRIPTED[QUIZ]}], default=VALID)
    settings = _settings(database_url, temporal_address, fake)
    async with engine_stack(settings, temporal_client, catalog=CATALOG, queues=JOB_QUEUES) as st:
        job_id = await st.create(job_type=QUIZ_LONG.definition.job_type, input=INPUTS[QUIZ])

        async def called() -> bool:
            return bool((await fake.acalls())["count"] >= 1)

        await eventually(called, timeout=30, what="the provider call to start")
        result = await st.service.cancel(
            job_id, "u1", cancel_workflow=workflow_canceller(temporal_client)
        )
        assert result.outcome == "cancel_requested"
        row = await st.wait_status(job_id, "cancelled", "failed", "succeeded", timeout=30)
        assert row.lifecycle_status == "cancelled", (row.error_code, row.internal_error_message)
        await _assert_charged_worst_case(st, job_id)
    assert (await fake.acalls())["count"] == 1


async def test_a_call_stopped_by_the_jobs_timeout_is_charged_its_worst_case(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    await fake.ascript([], default={"kind": "slow", "delay_s": 30, "content": SCRIPTED[QUIZ]})
    settings = _settings(database_url, temporal_address, fake)
    async with engine_stack(settings, temporal_client, catalog=CATALOG, queues=JOB_QUEUES) as st:
        job_id = await st.create(job_type=QUIZ_SHORT.definition.job_type, input=INPUTS[QUIZ])
        row = await st.wait_status(job_id, "failed", "succeeded", timeout=30)
        assert row.error_code in ("TIMEOUT", "PROVIDER_TIMEOUT")
        await _assert_charged_worst_case(st, job_id)


async def test_an_unknown_echo_never_spends_past_the_budget_under_concurrent_creates(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    policy = CreatePolicy(
        max_active_jobs=0, max_jobs_per_day=0, model="deepseek-chat", platform_synthetic=False
    )
    probe = JobService(db, default_catalog(), policy)
    req = CreateJobRequest(
        user_id="u1", job_type=QUIZ, target_type="t", target_id="t", input=INPUTS[QUIZ]
    )
    worst = (await probe.quote(req)).checked.estimate.worst_case_cost_usd
    budget = worst * 3 + worst / 2  # room for three jobs, not four
    # The proxy echoes `m` and reports an answer as long as the budget allows.
    answer = {**VALID, "echo_model": "m", "tokens_in": 400, "tokens_out": 4000}
    await fake.ascript([], default=answer)
    settings = _settings(
        database_url, temporal_address, fake, QUOTA_MAX_COST_USD_PER_DAY=float(budget)
    )
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        results = await asyncio.gather(
            *(st.service.create(dataclasses.replace(req, target_id=f"t{i}")) for i in range(12)),
            return_exceptions=True,
        )
        admitted = [r.job.id for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, BaseException)]
        assert len(admitted) == 3
        assert all(isinstance(r, QuotaExceeded) for r in refused), refused[:1]
        for job_id in admitted:
            row = await st.wait_status(job_id, "succeeded", "failed", timeout=60)
            assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
            [u] = await usage_rows(st, job_id)
            assert (u.model, u.priced_as, u.cost_basis) == ("m", "deepseek-chat", "reported")
            assert u.cost_usd == PRICES.call_cost("deepseek-chat", 400, 4000)
            assert u.cost_usd <= row.reserved_cost_usd  # a job never costs past its reservation
        assert await _spent_today(st.parts.sessionmaker, "u1") <= budget
    assert (await fake.acalls())["count"] == 3


async def test_cached_and_reasoning_tokens_are_reported_per_call_and_priced_by_the_table(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    usage_extra = {
        "prompt_cache_hit_tokens": 600,
        "prompt_cache_miss_tokens": 400,
        "completion_tokens_details": {"reasoning_tokens": 300},
    }
    step = {**VALID, "tokens_in": 1000, "tokens_out": 500, "usage_extra": usage_extra}
    await fake.ascript([], default=step)
    settings = _settings(database_url, temporal_address, fake)
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        job_id = await st.create(job_type=QUIZ, input=INPUTS[QUIZ])
        row = await st.wait_status(job_id, "succeeded", "failed", timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        body = await _job_usage(settings, job_id)
    [call] = body["attempts"][0]["providerCalls"]
    # deepseek-chat: 400 at 0.27, 600 cached at 0.07, 500 (300 reasoning) at 1.10 per million.
    expected = (400 * Decimal("0.27") + 600 * Decimal("0.07") + 500 * Decimal("1.10")) / 10**6
    assert call == {
        "costUsd": f"{expected:.8f}",
        "costBasis": "reported",
        "model": "deepseek-chat",
        "pricedAs": "deepseek-chat",
        "tokensIn": 1000,
        "tokensOut": 500,
        "cachedInputTokens": 600,
        "reasoningTokens": 300,
        "serviceTier": "standard",
    }
    assert body["estimatedCostUsd"] == "0.00000000"


async def test_a_call_cut_by_a_worker_drain_is_charged_before_the_worker_stops(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    await fake.ascript([], default={"kind": "slow", "delay_s": 30, "content": SCRIPTED[QUIZ]})
    # WORKER_DRAIN_S=0: the worker's shutdown cancels the call at once.
    settings = _settings(database_url, temporal_address, fake)
    async with engine_stack(settings, temporal_client, catalog=CATALOG, queues=JOB_QUEUES) as st:
        job_id = await st.create(job_type=QUIZ_LONG.definition.job_type, input=INPUTS[QUIZ])

        async def called() -> bool:
            return bool((await fake.acalls())["count"] >= 1)

        await eventually(called, timeout=30, what="the provider call to start")
    # The worker stopped: its call's row was written before it let the cancellation go.
    async with db() as s:
        [u] = (
            await s.execute(text("SELECT * FROM ai_usage_log WHERE job_id = :j"), {"j": job_id})
        ).all()
        row = (await s.execute(text("SELECT * FROM ai_job WHERE id = :j"), {"j": job_id})).one()
    assert u.error_code == "INTERNAL_WORKER_SHUTDOWN"
    assert (u.cost_basis, u.cost_usd) == ("estimated", _worst(row))
    assert await _spent_today(db, "u1") == _worst(row) > 0


async def test_a_create_and_cancel_loop_stops_where_the_budget_does(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    long_type = QUIZ_LONG.definition.job_type
    policy = CreatePolicy(
        max_active_jobs=0, max_jobs_per_day=0, model="deepseek-chat", platform_synthetic=False
    )
    req = CreateJobRequest(
        user_id="u1", job_type=long_type, target_type="t", target_id="t", input=INPUTS[QUIZ]
    )
    worst = (await JobService(db, CATALOG, policy).quote(req)).checked.estimate.worst_case_cost_usd
    budget = worst * 2 + worst / 2  # two cancelled calls, not three
    await fake.ascript([], default={"kind": "slow", "delay_s": 30, "content": SCRIPTED[QUIZ]})
    settings = _settings(
        database_url, temporal_address, fake, QUOTA_MAX_COST_USD_PER_DAY=float(budget)
    )
    cancelled = 0
    async with engine_stack(settings, temporal_client, catalog=CATALOG, queues=JOB_QUEUES) as st:
        for i in range(5):
            try:
                job_id = (
                    await st.service.create(dataclasses.replace(req, target_id=f"t{i}"))
                ).job.id
            except QuotaExceeded:
                break

            async def called(n: int = i + 1) -> bool:
                return bool((await fake.acalls())["count"] >= n)

            await eventually(called, timeout=30, what="the provider call to start")
            await st.service.cancel(
                job_id, "u1", cancel_workflow=workflow_canceller(temporal_client)
            )
            row = await st.wait_status(job_id, "cancelled", "failed", "succeeded", timeout=30)
            assert row.lifecycle_status == "cancelled"
            cancelled += 1
        assert await _spent_today(st.parts.sessionmaker, "u1") == worst * 2 <= budget
    assert cancelled == 2
    assert (await fake.acalls())["count"] == 2
