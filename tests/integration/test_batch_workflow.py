"""The batch workflow over real PostgreSQL, Temporal and the fake server's Batches API: items
enrolled directly (db/batches.py `enroll`, as the job side's enroll does) within one window go
to the provider as one batch and no chat call; the results are stored, each answered item
charged once at the batch price, and each item's job workflow signalled `batch-result`; a
batch whose every item left is cancelled at the provider, and one emptied before its upload
never reaches it.

The jobs' workflows are stand-ins (a listener that ends on `batch-result`) on a task queue of
this test: the job side's own workflow is tested beside it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from temporalio import workflow
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.batch import BatchActivities, BatchTiming, start_batch_workflow
from activities.batch_files import BatchFiles, gateway_clients
from activities.deps import StageDeps
from db import batches as batches_db
from db import lifecycle as lifecycle_db
from db.batches import Enrolled, custom_id_of
from db.lifecycle import NewJob
from db.provider_gate import PLATFORM_KEY_REF
from db.session import SessionMaker
from engine.tiers import BATCH_POKE_SIGNAL, BATCH_RESULT_SIGNAL
from providers.batch_lines import encode_line
from providers.pricing import PriceTable
from runtime.wiring import gateway
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import fake_env
from tests.stack import INTERACTIVE, Stack, engine_stack, make_settings
from tests.support import eventually

MODEL = "gpt-4o-mini"
BODY = {
    "model": MODEL,
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "src"}],
    "response_format": {"type": "json_object"},
    "max_tokens": 500,
    "stream": True,
    "stream_options": {"include_usage": True},
}
VALID = {"kind": "valid", "content": {"ok": True}, "tokens_in": 1000, "tokens_out": 1000}


@workflow.defn(name="test_batch_listener")
class Listener:
    """Stands in for a job workflow: ends with the number of `batch-result` signals seen."""

    def __init__(self) -> None:
        self.got = 0

    @workflow.signal(name=BATCH_RESULT_SIGNAL)
    def result(self) -> None:
        self.got += 1

    @workflow.run
    async def run(self) -> int:
        await workflow.wait_condition(lambda: self.got > 0)
        return self.got


@pytest.fixture
async def stack(
    database_url: str, temporal_address: str, temporal_client: Client, fake: FakeOpenAIServer
) -> AsyncIterator[Stack]:
    settings = make_settings(
        database_url,
        temporal_address,
        **fake_env(fake, AI_MODEL=MODEL, AI_BATCH_WINDOW_S=1.0, AI_BATCH_POLL_S=0.3),
    )
    async with engine_stack(settings, temporal_client, queues=INTERACTIVE, relay=False) as s:
        yield s


def task_queue(stack: Stack) -> str:
    return stack.settings.task_queue(INTERACTIVE[0])


async def new_job(db: SessionMaker, workflow_id: str) -> uuid.UUID:
    job_id = uuid.uuid4()
    job = NewJob(
        id=job_id,
        user_id="u-batch",
        job_type="flashcard_generation",
        target_type="test",
        target_id="t1",
        idempotency_key=None,
        request_fingerprint="f" * 64,
        queue_name="ai-background",
        priority=50,
        input={},
        credential_mode="platform_key",
        credential_id=None,
        prompt_version="v1",
        input_schema_version="x.input.v1",
        output_schema_version="x.output.v1",
        max_retry_count=1,
        workflow_id=workflow_id,
        service_tier="batch",
    )
    async with db.begin() as s:
        await lifecycle_db.create(s, job)
    return job_id


async def enroll(stack: Stack, job_id: uuid.UUID) -> Enrolled:
    async with stack.parts.sessionmaker.begin() as s:
        enrolled = await batches_db.enroll(
            s,
            job_id=job_id,
            attempt=1,
            provider="openai_compatible",
            model=MODEL,
            key_ref=PLATFORM_KEY_REF,
            task_queue=task_queue(stack),
            body=BODY,
            line_bytes=len(encode_line(custom_id_of(job_id, 1), BODY)),
        )
    await start_batch_workflow(stack.client, enrolled, task_queue(stack))
    return enrolled


async def batch_status(db: SessionMaker, batch_id: uuid.UUID, *wanted: str) -> Any:
    async def probe() -> Any:
        async with db() as s:
            row = await batches_db.get(s, batch_id)
        return row if row is not None and row.status in wanted else None

    return await eventually(probe, timeout=30, what=f"batch {batch_id} to reach {wanted}")


async def rows(db: SessionMaker, sql: str, **params: Any) -> list[Any]:
    async with db() as s:
        return list(await s.execute(text(sql), params))


async def test_enrollments_of_one_window_are_one_batch_charged_once_and_signalled(
    stack: Stack, db: SessionMaker, fake: FakeOpenAIServer, temporal_client: Client
) -> None:
    await fake.ascript([VALID, VALID, {"kind": "status", "status": 500}, VALID, VALID])
    # The files' deletes fail for now: a poll retried below reads them again.
    await fake.abatch_script(delete_status=503)
    listen_queue = f"batch-listen-{uuid.uuid4().hex[:8]}"
    async with Worker(
        temporal_client,
        task_queue=listen_queue,
        workflows=[Listener],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handles, jobs = [], []
        for _ in range(5):
            workflow_id = f"test-batch-job:{uuid.uuid4()}"
            handles.append(
                await temporal_client.start_workflow(
                    Listener.run, id=workflow_id, task_queue=listen_queue
                )
            )
            jobs.append(await new_job(db, workflow_id))
        enrolled = [await enroll(stack, job_id) for job_id in jobs]
        assert len({e.batch_id for e in enrolled}) == 1
        assert await enroll(stack, jobs[0]) == enrolled[0]  # a retried enroll finds its item
        batch_id = enrolled[0].batch_id
        ended = await batch_status(db, batch_id, "completed", "failed", "expired", "cancelled")
        assert ended.status == "completed" and ended.item_count == 5
        assert [await h.result() for h in handles] == [1, 1, 1, 1, 1]

    seen = await fake.abatches()
    assert [b["lines"] for b in seen["batches"]] == [5]
    assert (await fake.acalls())["count"] == 0
    for line in seen["batches"][0]["requests"]:
        assert list(line) == ["custom_id", "method", "url", "body"]
        assert line["url"] == "/v1/chat/completions" and "stream" not in line["body"]
    assert sorted(line["custom_id"] for line in seen["batches"][0]["requests"]) == sorted(
        e.custom_id for e in enrolled
    )
    items = await rows(
        db, "SELECT status, error_code FROM ai_batch_item WHERE batch_id = :b", b=batch_id
    )
    assert sorted((i.status, i.error_code) for i in items) == [
        ("failed", "PROVIDER_UNAVAILABLE"),
        *[("succeeded", None)] * 4,
    ]
    half = PriceTable().call_cost(MODEL, 1000, 1000, tier="batch")
    assert half * 2 == PriceTable().call_cost(MODEL, 1000, 1000)
    usage_sql = (
        "SELECT u.service_tier, u.cost_usd, j.spent_cost_usd FROM ai_usage_log u "
        "JOIN ai_job j ON j.id = u.job_id WHERE u.job_id = ANY(:jobs)"
    )
    usage = await rows(db, usage_sql, jobs=jobs)
    assert [(u.service_tier, u.cost_usd, u.spent_cost_usd) for u in usage] == [
        ("batch", half, half)
    ] * 4

    # A poll retried after the batch's results were recorded charges nothing again.
    async with db.begin() as s:
        await s.execute(
            text("UPDATE ai_batch SET status = 'submitted' WHERE id = :b"), {"b": batch_id}
        )
    deps = StageDeps(stack.parts.sessionmaker, stack.parts.catalog, gateway(stack.settings))
    acts = BatchActivities(deps, temporal_client, BatchTiming())
    assert await ActivityEnvironment().run(acts.poll, str(batch_id)) == "completed"
    assert len(await rows(db, usage_sql, jobs=jobs)) == 4
    spent = await rows(db, "SELECT sum(spent_cost_usd) AS s FROM ai_job WHERE id = ANY(:j)", j=jobs)
    assert spent[0].s == half * 4

    # The failed deletes wait for the reconciler's retention phase, which deletes them once due.
    files_sql = "SELECT role, deleted_at FROM ai_batch_file WHERE batch_id = :b"
    kept = await rows(db, files_sql, b=batch_id)
    assert sorted(f.role for f in kept) == ["error", "input", "output"]
    assert all(f.deleted_at is None for f in kept)
    await fake.abatch_script()
    async with db.begin() as s:
        await s.execute(
            text("UPDATE ai_batch_file SET next_try_at = now() WHERE batch_id = :b"),
            {"b": batch_id},
        )
    files = BatchFiles(stack.parts.sessionmaker, gateway_clients(deps.gateway))
    assert await files.delete_due() == 3
    assert all(f.deleted_at is not None for f in await rows(db, files_sql, b=batch_id))
    seen = await fake.abatches()
    assert all(f["deleted"] for f in seen["files"])
    await deps.gateway.aclose()


async def test_a_batch_every_item_of_which_left_is_cancelled_at_the_provider(
    stack: Stack, db: SessionMaker, fake: FakeOpenAIServer, temporal_client: Client
) -> None:
    await fake.abatch_script(hold=True)
    jobs = [await new_job(db, f"test-batch-gone:{uuid.uuid4()}") for _ in range(2)]
    enrolled = [await enroll(stack, job_id) for job_id in jobs]
    batch_id = enrolled[0].batch_id
    submitted = await batch_status(db, batch_id, "submitted")
    lefts = []
    for job_id in jobs:
        async with db.begin() as s:
            lefts.append(await batches_db.leave(s, job_id))
    assert [left.all_cancelled for left in lefts if left] == [False, True]
    await temporal_client.get_workflow_handle(enrolled[0].workflow_id).signal(BATCH_POKE_SIGNAL)
    await batch_status(db, batch_id, "cancelled")
    seen = await fake.abatches()
    assert seen["cancels"] == [submitted.provider_batch_id]
    assert (await fake.acalls())["count"] == 0
    items = await rows(db, "SELECT status FROM ai_batch_item WHERE batch_id = :b", b=batch_id)
    assert [i.status for i in items] == ["cancelled", "cancelled"]
    assert await rows(db, "SELECT 1 FROM ai_usage_log WHERE job_id = ANY(:j)", j=jobs) == []


async def test_a_batch_emptied_before_its_upload_never_reaches_the_provider(
    stack: Stack, db: SessionMaker, fake: FakeOpenAIServer, temporal_client: Client
) -> None:
    job_id = await new_job(db, f"test-batch-early:{uuid.uuid4()}")
    enrolled = await enroll(stack, job_id)
    async with db.begin() as s:
        left = await batches_db.leave(s, job_id)
    assert left is not None and left.all_cancelled and left.batch_status == "open"
    await temporal_client.get_workflow_handle(enrolled.workflow_id).signal(BATCH_POKE_SIGNAL)
    await batch_status(db, enrolled.batch_id, "cancelled")
    assert (await fake.abatches())["uploads"] == 0
    async with db() as s:
        item = await batches_db.item_for(s, job_id, 1)
    assert item is not None and (item.status, item.batch_status) == ("cancelled", "cancelled")


async def test_a_job_that_left_a_running_batch_is_charged_for_its_answer_but_keeps_none(
    stack: Stack, db: SessionMaker, fake: FakeOpenAIServer
) -> None:
    await fake.ascript([], default=VALID)
    await fake.abatch_script(hold=True)
    # No workflow of these ids exists: signalling them is logged and skipped.
    jobs = [await new_job(db, f"test-batch-absent:{uuid.uuid4()}") for _ in range(2)]
    enrolled = [await enroll(stack, job_id) for job_id in jobs]
    batch_id = enrolled[0].batch_id
    await batch_status(db, batch_id, "submitted")
    async with db.begin() as s:
        left = await batches_db.leave(s, jobs[0])
    assert left is not None and not left.all_cancelled and left.batch_status == "submitted"
    await fake.arelease()
    await batch_status(db, batch_id, "completed")
    items = await rows(
        db,
        "SELECT job_id, status, response IS NOT NULL AS answered FROM ai_batch_item "
        "WHERE batch_id = :b",
        b=batch_id,
    )
    by_job = {i.job_id: (i.status, i.answered) for i in items}
    assert by_job == {jobs[0]: ("cancelled", False), jobs[1]: ("succeeded", True)}
    usage = await rows(db, "SELECT job_id FROM ai_usage_log WHERE job_id = ANY(:j)", j=jobs)
    assert sorted(u.job_id for u in usage) == sorted(jobs)


async def test_a_refused_create_and_an_expired_batch_fail_their_items_for_a_retry(
    stack: Stack, db: SessionMaker, fake: FakeOpenAIServer
) -> None:
    # A create the provider refuses for good: no retry, the items fail with its code.
    await fake.abatch_script(create_status=400, fail_times=1)
    job_id = await new_job(db, f"test-batch-refused:{uuid.uuid4()}")
    refused = await enroll(stack, job_id)
    await batch_status(db, refused.batch_id, "failed")
    async with db() as s:
        item = await batches_db.item_for(s, job_id, 1)
    assert item is not None and (item.status, item.error_code) == ("failed", "REQUEST_REJECTED")

    # An expired batch: the line it answered is stored, the other fails PROVIDER_UNAVAILABLE.
    await fake.ascript([], default=VALID)
    await fake.abatch_script(end_status="expired", answer_lines=1)
    jobs = [await new_job(db, f"test-batch-expired:{uuid.uuid4()}") for _ in range(2)]
    expired = [await enroll(stack, j) for j in jobs]
    await batch_status(db, expired[0].batch_id, "expired")
    items = await rows(
        db,
        "SELECT status, error_code FROM ai_batch_item WHERE batch_id = :b ORDER BY custom_id",
        b=expired[0].batch_id,
    )
    assert sorted((i.status, i.error_code) for i in items) == [
        ("failed", "PROVIDER_UNAVAILABLE"),
        ("succeeded", None),
    ]
    assert len(await rows(db, "SELECT 1 FROM ai_usage_log WHERE job_id = ANY(:j)", j=jobs)) == 1
