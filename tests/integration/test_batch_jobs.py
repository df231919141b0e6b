"""Batch-tier jobs end to end over real PostgreSQL, Temporal and the fake server's Files and
Batches endpoints: the jobs of one window reach the provider as one batch (or two) and no chat
call, each succeeds and costs half its standard price; a job cancelled while its batch runs ends
`cancelled`, and its batch, which no other job waits for, is cancelled at the provider; a failed
line (or an invalid answer) retries that job alone, in the next batch, with its correction.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from jobs.types import flashcard_generation as flashcards
from providers.pricing import PriceTable
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import workflow_canceller
from tests.integration.provider_helpers import fake_env
from tests.job_data import INPUTS, SCRIPTED, SOURCE
from tests.stack import INTERACTIVE, Stack, engine_stack, make_settings, variant
from tests.support import eventually

MODEL = "gpt-4o-mini"
TYPE = "flashcard_generation"
VALID = {"kind": "valid", "content": SCRIPTED[TYPE], "tokens_in": 1200, "tokens_out": 300}
ONCE = variant(flashcards.JOB, "test_flashcards_batch_once", max_retries=0)


def batch_stack(
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
    window_s: float = 2.0,
) -> Any:
    settings = make_settings(
        database_url,
        temporal_address,
        **fake_env(fake, AI_MODEL=MODEL, AI_BATCH_WINDOW_S=window_s, AI_BATCH_POLL_S=0.3),
    )
    return engine_stack(settings, temporal_client, queues=INTERACTIVE, extra_types=(ONCE,))


@pytest.fixture
async def stack(
    database_url: str, temporal_address: str, temporal_client: Client, fake: FakeOpenAIServer
) -> AsyncIterator[Stack]:
    async with batch_stack(database_url, temporal_address, temporal_client, fake) as s:
        yield s


async def create(stack: Stack, n: int, job_type: str = TYPE) -> list[uuid.UUID]:
    return [
        await stack.create("u-batch", job_type=job_type, input=INPUTS[TYPE], service_tier="batch")
        for _ in range(n)
    ]


async def rows(db: SessionMaker, sql: str, **params: Any) -> list[Any]:
    async with db() as s:
        return list(await s.execute(text(sql), params))


async def test_five_batch_jobs_are_one_or_two_batches_no_call_and_half_the_price(
    stack: Stack, db: SessionMaker, fake: FakeOpenAIServer, temporal_client: Client
) -> None:
    await fake.ascript([], default=VALID)
    jobs = await create(stack, 5)
    for job_id in jobs:
        row = await stack.wait_status(job_id, timeout=60)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.output == SCRIPTED[TYPE] and row.attempt_count == 1
    seen = await fake.abatches()
    assert len(seen["batches"]) in (1, 2)
    assert sum(b["lines"] for b in seen["batches"]) == 5
    assert (await fake.acalls())["count"] == 0
    for line in (r for b in seen["batches"] for r in b["requests"]):
        body = line["body"]
        assert list(line) == ["custom_id", "method", "url", "body"]
        assert "stream" not in body and "stream_options" not in body
        # A model other than DeepSeek's is asked for the strict schema of the output.
        assert body["model"] == MODEL and body["response_format"]["type"] == "json_schema"
        assert body["response_format"]["json_schema"]["strict"] is True
        assert body["max_tokens"] > 0 and [m["role"] for m in body["messages"]] == [
            "system",
            "user",
        ]
    prices = PriceTable()
    usage = await rows(
        db,
        "SELECT u.job_id, u.service_tier, u.tokens_in, u.tokens_out, u.cost_usd, "
        "j.spent_cost_usd FROM ai_usage_log u JOIN ai_job j ON j.id = u.job_id "
        "WHERE u.job_id = ANY(:j)",
        j=jobs,
    )
    assert sorted(u.job_id for u in usage) == sorted(jobs)  # one charged call each
    for u in usage:
        standard = prices.call_cost(MODEL, u.tokens_in, u.tokens_out)
        assert u.service_tier == "batch" and u.cost_usd * 2 == standard > 0
        assert u.spent_cost_usd == u.cost_usd
    artifacts = await rows(
        db, "SELECT count(*) AS n FROM ai_job_artifact WHERE job_id = ANY(:j)", j=jobs
    )
    assert artifacts[0].n == 5 * len(SCRIPTED[TYPE]["flashcards"])
    # The job's history holds ids, hashes and codes: never its prompt or its answer.
    wf = temporal_client.get_workflow_handle(stack.workflow_id(jobs[0], TYPE))
    history = b"".join([e.SerializeToString() async for e in wf.fetch_history_events()])
    assert b"batch_enroll" in history and b"batch_collect" in history
    assert SOURCE[:40].encode() not in history
    assert SCRIPTED[TYPE]["flashcards"][0]["back"].encode() not in history


async def test_a_job_cancelled_while_its_batch_runs_ends_cancelled_and_its_batch_too(
    stack: Stack, db: SessionMaker, fake: FakeOpenAIServer, temporal_client: Client
) -> None:
    await fake.ascript([], default=VALID)
    await fake.abatch_script(hold=True)
    [job_id] = await create(stack, 1)

    async def submitted() -> Any:
        found = await rows(
            db,
            "SELECT b.status, b.provider_batch_id FROM ai_batch_item i "
            "JOIN ai_batch b ON b.id = i.batch_id WHERE i.job_id = :j",
            j=job_id,
        )
        return found[0] if found and found[0].status == "submitted" else None

    batch = await eventually(submitted, timeout=30, what="the job's batch to be submitted")
    row = await stack.job(job_id)
    # Running while its batch runs, its lock held over the batch's window: no reconciler
    # takes it for abandoned.
    assert row.lifecycle_status == "running"
    assert row.lock_until > dt.datetime.now(dt.UTC) + dt.timedelta(hours=23)
    result = await stack.service.cancel(
        job_id, "u-batch", cancel_workflow=workflow_canceller(temporal_client)
    )
    assert result.outcome == "cancel_requested"
    row = await stack.wait_status(job_id, timeout=30)
    assert row.lifecycle_status == "cancelled", (row.error_code, row.internal_error_message)

    async def provider_cancelled() -> bool:
        return batch.provider_batch_id in (await fake.abatches())["cancels"]

    await eventually(provider_cancelled, timeout=30, what="the batch's cancel at the provider")
    assert (await fake.acalls())["count"] == 0
    items = await rows(db, "SELECT status FROM ai_batch_item WHERE job_id = :j", j=job_id)
    assert [i.status for i in items] == ["cancelled"]


async def test_a_failed_line_retries_that_job_alone_in_the_next_batch(
    stack: Stack, db: SessionMaker, fake: FakeOpenAIServer
) -> None:
    # Lines are answered in their file's order: one fails (a 500, an error-file line), one's
    # answer does not match the schema; those two jobs retry in the next batch, the third not.
    steps: list[dict[str, Any]] = [
        VALID,
        {"kind": "status", "status": 500},
        {"kind": "schema_invalid"},
    ]
    await fake.ascript(steps, default=VALID)
    jobs = await create(stack, 3)
    for job_id in jobs:
        row = await stack.wait_status(job_id, timeout=60)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.output == SCRIPTED[TYPE]
    seen = await fake.abatches()
    assert (await fake.acalls())["count"] == 0
    assert sum(b["lines"] for b in seen["batches"]) == 5
    items = await rows(
        db,
        "SELECT job_id, attempt, status, error_code, custom_id FROM ai_batch_item "
        "WHERE job_id = ANY(:j)",
        j=jobs,
    )
    firsts = sorted((i.status, i.error_code) for i in items if i.attempt == 1)
    assert firsts == [("failed", "PROVIDER_UNAVAILABLE"), ("succeeded", None), ("succeeded", None)]
    retried = sorted(i.custom_id for i in items if i.attempt == 2)
    # The retries went in a later batch of their own: no first attempt rode with them.
    later = [
        r
        for b in seen["batches"]
        if any(r["custom_id"].endswith("-a2") for r in b["requests"])
        for r in b["requests"]
    ]
    assert sorted(r["custom_id"] for r in later) == retried
    again = {i.job_id for i in items if i.attempt == 2}
    counts = {job_id: (await stack.job(job_id)).attempt_count for job_id in jobs}
    assert counts == {j: 2 if j in again else 1 for j in jobs}
    # The invalid answer's retry carries its correction; the failed request's does not.
    corrected = [
        "previous answer was rejected" in r["body"]["messages"][-1]["content"] for r in later
    ]
    assert sorted(corrected) == [False, True]
    usage = await rows(db, "SELECT service_tier FROM ai_usage_log WHERE job_id = ANY(:j)", j=jobs)
    assert [u.service_tier for u in usage] == ["batch"] * 4  # every answered line, once


async def test_a_failed_line_with_no_attempt_left_fails_the_job_with_its_code(
    stack: Stack, db: SessionMaker, fake: FakeOpenAIServer
) -> None:
    await fake.ascript([{"kind": "status", "status": 500}], default=VALID)
    [job_id] = await create(stack, 1, ONCE.definition.job_type)
    row = await stack.wait_status(job_id, timeout=60)
    assert (row.lifecycle_status, row.error_code) == ("failed", "PROVIDER_UNAVAILABLE")
    assert row.attempt_count == 1
    assert [b["lines"] for b in (await fake.abatches())["batches"]] == [1]
    assert await rows(db, "SELECT 1 FROM ai_usage_log WHERE job_id = :j", j=job_id) == []


async def test_a_job_cancelled_before_its_batch_is_uploaded_leaves_it_and_nothing_is_sent(
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    db: SessionMaker,
    fake: FakeOpenAIServer,
) -> None:
    await fake.ascript([], default=VALID)
    # A window far longer than the test: only the leave's poke can end the batch in time.
    async with batch_stack(
        database_url, temporal_address, temporal_client, fake, window_s=600.0
    ) as stack:
        [job_id] = await create(stack, 1)

        async def pending() -> Any:
            found = await rows(
                db,
                "SELECT i.status, i.batch_id FROM ai_batch_item i WHERE i.job_id = :j",
                j=job_id,
            )
            return found[0] if found and found[0].status == "pending" else None

        item = await eventually(pending, timeout=30, what="the job's item in the open batch")
        assert (await stack.job(job_id)).lifecycle_status == "running"
        result = await stack.service.cancel(
            job_id, "u-batch", cancel_workflow=workflow_canceller(temporal_client)
        )
        assert result.outcome == "cancel_requested"
        row = await stack.wait_status(job_id, timeout=30)
        assert row.lifecycle_status == "cancelled", (row.error_code, row.internal_error_message)

        async def batch_ended() -> Any:
            found = await rows(db, "SELECT status FROM ai_batch WHERE id = :b", b=item.batch_id)
            # `submitting` is on the way: the poke closes the window, then the submit ends it.
            return found[0].status if found[0].status not in ("open", "submitting") else None

        status = await eventually(batch_ended, timeout=30, what="the emptied batch to end")
        assert status == "cancelled"
    seen = await fake.abatches()
    assert (seen["uploads"], seen["batches"], (await fake.acalls())["count"]) == (0, [], 0)


async def test_a_line_refused_for_its_form_enrolls_again_one_form_down(
    stack: Stack, db: SessionMaker, fake: FakeOpenAIServer
) -> None:
    await fake.arefuse_forms("json_schema")
    await fake.ascript([], default=VALID)
    [job_id] = await create(stack, 1)
    row = await stack.wait_status(job_id, timeout=60)
    assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
    assert row.attempt_count == 1  # the refusal spent no attempt
    seen = await fake.abatches()
    forms = [r["body"]["response_format"]["type"] for b in seen["batches"] for r in b["requests"]]
    assert forms == ["json_schema", "json_object"]
    assert len(seen["batches"]) == 2  # the lower form went in the next batch
    lowered = await rows(db, "SELECT model, form FROM ai_structured_downgrade")
    assert [(r.model, r.form) for r in lowered] == [(MODEL, "json_object")]
    usage = await rows(
        db, "SELECT structured_output, error_code FROM ai_usage_log WHERE job_id = :j", j=job_id
    )
    assert [(u.structured_output, u.error_code) for u in usage] == [("json_object", None)]
