"""The batch tier under faults, end to end over real PostgreSQL, Temporal and the fake server's
Files and Batches endpoints (docs/batch.md, "Failure modes"):

- a line whose answer cannot be stored costs only its own job: the others succeed, every
  answered line is charged once, the bad job retries alone and fails VALIDATION_OUTPUT_INVALID,
  and the batch ends (its workflow closes: no more polls);
- the caps split the batches (AI_BATCH_MAX_LINES, AI_BATCH_MAX_BYTES), a batch closed at a cap
  goes without waiting for its window, no uploaded file is past a cap, a line larger than a
  batch is refused at create;
- lost upload and create answers (25 newer batches of another client listed first) make one
  provider batch per engine batch, each line charged once, every file deleted afterwards;
- a batch job cancelled once its batch is closed keeps its worst case counted in its owner's
  budget until its line's outcome is recorded: a create, submit, cancel loop never spends past
  the budget, and a line never answered ends its hold uncharged.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client, WorkflowExecutionStatus

from db import budgets as budgets_db
from db.batches import workflow_id_of
from db.session import SessionMaker
from engine.errors import QuotaExceeded, ValidationFailed
from jobs.service import CreateJobRequest, JobService
from jobs.types import default_catalog
from jobs.types import flashcard_generation as flashcards
from runtime.wiring import create_policy
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import workflow_canceller
from tests.integration.provider_helpers import fake_env
from tests.job_data import INPUTS, SCRIPTED, SOURCE
from tests.stack import INTERACTIVE, Stack, engine_stack, make_settings, variant
from tests.support import eventually

MODEL = "gpt-4o-mini"
TYPE = "flashcard_generation"
VALID = {"kind": "valid", "content": SCRIPTED[TYPE], "tokens_in": 300, "tokens_out": 120}
TWICE = variant(flashcards.JOB, "test_flashcards_batch_twice", max_retries=1)
MARK = "LONE-SURROGATE-MARK"


@pytest.fixture
def batch_settings(database_url: str, temporal_address: str, fake: FakeOpenAIServer) -> Any:
    def build(**env: Any) -> Any:
        values = {"AI_MODEL": MODEL, "AI_BATCH_WINDOW_S": 3.0, "AI_BATCH_POLL_S": 0.5, **env}
        return make_settings(database_url, temporal_address, **fake_env(fake, **values))

    return build


async def rows(db: SessionMaker, sql: str, **params: Any) -> list[Any]:
    async with db() as s:
        return list(await s.execute(text(sql), params))


async def create(stack: Stack, user: str, source: str = SOURCE, job_type: str = TYPE) -> uuid.UUID:
    return await stack.create(
        user,
        job_type=job_type,
        input={**INPUTS[TYPE], "sourceText": source},
        service_tier="batch",
    )


async def ours(fake: FakeOpenAIServer) -> list[dict[str, Any]]:
    """The provider batches the engine made (not another client's)."""
    return [b for b in (await fake.abatches())["batches"] if not b["foreign"]]


@pytest.fixture
async def stack(batch_settings: Any, temporal_client: Client) -> AsyncIterator[Stack]:
    async with engine_stack(
        batch_settings(), temporal_client, queues=INTERACTIVE, extra_types=(TWICE,)
    ) as s:
        yield s


async def test_a_line_that_cannot_be_stored_costs_only_its_own_job(
    stack: Stack, db: SessionMaker, fake: FakeOpenAIServer, temporal_client: Client
) -> None:
    out = copy.deepcopy(SCRIPTED[TYPE])
    out["flashcards"][0]["front"] = "PLACEHOLDER"
    lone = {**VALID, "content_text": json.dumps(out).replace('"PLACEHOLDER"', '"x\ud800"')}
    await fake.ascript([], default=VALID, rules=[(MARK, lone)])
    good = [await create(stack, user) for user in ("u-a", "u-b", "u-a")]
    bad = await create(stack, "u-b", f"{MARK} {SOURCE}", TWICE.definition.job_type)
    for job_id in good:
        row = await stack.wait_status(job_id, timeout=60)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
    row = await stack.wait_status(bad, timeout=60)
    assert (row.lifecycle_status, row.error_code, row.attempt_count) == (
        "failed",
        "VALIDATION_OUTPUT_INVALID",
        2,
    )
    usage = await rows(
        db,
        "SELECT job_id, attempt_no, error_code, service_tier, cost_usd FROM ai_usage_log "
        "WHERE job_id = ANY(:j) ORDER BY job_id, attempt_no",
        j=[*good, bad],
    )
    assert sorted((u.job_id, u.error_code) for u in usage if u.job_id != bad) == sorted(
        (j, None) for j in good
    )
    assert [(u.attempt_no, u.error_code) for u in usage if u.job_id == bad] == [
        (1, "VALIDATION_OUTPUT_INVALID"),
        (2, "VALIDATION_OUTPUT_INVALID"),
    ]
    assert all(u.service_tier == "batch" and u.cost_usd > 0 for u in usage)
    seen = await ours(fake)
    assert [b["lines"] for b in seen] == [4, 1]  # the bad job alone in the next batch
    assert len(usage) == sum(b["lines"] for b in seen)  # every answered line charged once
    items = await rows(
        db, "SELECT status, error_code, response FROM ai_batch_item WHERE job_id = :j", j=bad
    )
    assert [(i.status, i.error_code, i.response) for i in items] == [
        ("failed", "VALIDATION_OUTPUT_INVALID", None)
    ] * 2
    # Each batch ended and its workflow closed: nothing polls it any more.
    for batch in await rows(db, "SELECT id, status FROM ai_batch"):
        assert batch.status == "completed"
        handle = temporal_client.get_workflow_handle(workflow_id_of(batch.id))
        assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED


async def test_the_caps_split_batches_and_a_full_batch_goes_at_once(
    batch_settings: Any, temporal_client: Client, db: SessionMaker, fake: FakeOpenAIServer
) -> None:
    await fake.ascript([], default=VALID)
    # A window far longer than the test: only a cap sends a batch, at once.
    settings = batch_settings(
        AI_BATCH_WINDOW_S=120.0, AI_BATCH_MAX_LINES=2, AI_BATCH_MAX_BYTES=40_000
    )
    long_source = (SOURCE + " ") * (25_000 // len(SOURCE))
    async with engine_stack(settings, temporal_client, queues=INTERACTIVE) as stack:
        with pytest.raises(ValidationFailed) as refused:
            await create(stack, "u-c", long_source * 2)
        assert refused.value.errors[0]["loc"] == ["body", "serviceTier"]
        # Four small lines: two batches of two, each closed by the line cap. Three lines of
        # about 26 kB: each closes the batch before it (two would pass 40000 bytes); a last
        # small line fills the third one's batch to the line cap.
        jobs = [await create(stack, "u-c") for _ in range(4)]
        for job_id in jobs:
            await stack.wait_status(job_id, timeout=60)
        big = [await create(stack, "u-c", f"{n} {long_source}") for n in range(3)]

        async def enrolled() -> bool:
            found = await rows(db, "SELECT 1 FROM ai_batch_item WHERE job_id = ANY(:j)", j=big)
            return len(found) == 3

        await eventually(enrolled, timeout=30, what="the three long lines to be enrolled")
        jobs += [*big, await create(stack, "u-c")]
        for job_id in jobs:
            row = await stack.wait_status(job_id, timeout=60)
            assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
    uploads = (await fake.abatches())["upload_log"]
    assert [u["lines"] for u in uploads] == [2, 2, 1, 1, 2]
    assert all(u["bytes"] <= 40_000 and not u["chunked"] for u in uploads)
    assert all(20_000 < u["bytes"] for u in uploads[2:])
    assert all(int(u["content_length"]) == u["body_bytes"] for u in uploads)
    sizes = await rows(
        db,
        "SELECT item_count, byte_count, extract(epoch FROM submitted_at - created_at) AS waited "
        "FROM ai_batch ORDER BY created_at",
    )
    assert [s.item_count for s in sizes] == [2, 2, 1, 1, 2]
    assert [s.byte_count for s in sizes] == [u["bytes"] for u in uploads]
    assert all(s.waited < 60 for s in sizes)  # none waited out its window


async def test_lost_answers_make_one_provider_batch_and_every_file_is_deleted(
    stack: Stack, db: SessionMaker, fake: FakeOpenAIServer
) -> None:
    await fake.ascript([], default=VALID)
    await fake.abatch_script(lose_upload=1, lose_create=1, foreign_after_create=25)
    jobs = [await create(stack, "u-d") for _ in range(3)]
    for job_id in jobs:
        row = await stack.wait_status(job_id, timeout=60)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
    engine_batches = await rows(db, "SELECT id, input_file_id FROM ai_batch")
    seen = await ours(fake)
    assert sorted(b["metadata"]["ai_batch_id"] for b in seen) == sorted(
        str(b.id) for b in engine_batches
    )
    custom_ids = [r["custom_id"] for b in seen for r in b["requests"]]
    assert sorted(custom_ids) == sorted(f"job-{j}-a1" for j in jobs)  # each line in one batch
    usage = await rows(db, "SELECT job_id FROM ai_usage_log WHERE job_id = ANY(:j)", j=jobs)
    assert sorted(u.job_id for u in usage) == sorted(jobs)  # each job charged once
    state = await fake.abatches()
    assert len(state["upload_log"]) == len(engine_batches)  # the lost upload was adopted
    files = {f["id"]: f for f in state["files"]}

    async def deleted() -> bool:
        files.update({f["id"]: f for f in (await fake.abatches())["files"]})
        wanted = [b[k] for b in seen for k in ("input_file_id", "output_file_id") if b[k]]
        return all(files[f]["deleted"] for f in wanted)

    await eventually(deleted, timeout=30, what="every batch's files to be deleted")
    recorded = await rows(db, "SELECT role, deleted_at FROM ai_batch_file")
    assert sorted(r.role for r in recorded) == ["input", "output"] * len(seen)
    assert all(r.deleted_at is not None for r in recorded)


async def standing(db: SessionMaker, user: str) -> tuple[Decimal, Decimal]:
    """The user's spend today and open reservations, as a budget decision reads them."""
    async with db() as s:
        read = await budgets_db.standing(
            s, user, spent_since=[dt.datetime.now(dt.UTC).date()], reserved=True
        )
    return read.spent_since[0], read.reserved_usd


async def admitted_until_refused(stack: Stack, user: str) -> list[uuid.UUID]:
    made: list[uuid.UUID] = []
    for _ in range(10):
        try:
            made.append(await create(stack, user))
        except QuotaExceeded:
            return made
    raise AssertionError("the budget never refused a create")


async def test_a_cancelled_batch_job_keeps_its_worst_case_counted_until_its_line_is_charged(
    batch_settings: Any, temporal_client: Client, db: SessionMaker, fake: FakeOpenAIServer
) -> None:
    probe = JobService(db, default_catalog(), create_policy(batch_settings()))
    req = CreateJobRequest("u-e", TYPE, "test", "t1", INPUTS[TYPE], service_tier="batch")
    worst = (await probe.quote(req)).checked.estimate.worst_case_cost_usd
    budget = (worst * Decimal("3.5")).quantize(Decimal("0.00000001"))
    # Every line answered at its whole answer budget: the provider bills close to the worst case.
    await fake.ascript([], default={**VALID, "tokens_out": "max"})
    await fake.abatch_script(hold=True)
    settings = batch_settings(QUOTA_MAX_COST_USD_PER_DAY=float(budget))
    async with engine_stack(settings, temporal_client, queues=INTERACTIVE) as stack:
        jobs = await admitted_until_refused(stack, "u-e")
        assert len(jobs) == 3

        async def submitted() -> bool:
            found = await rows(
                db, "SELECT status FROM ai_batch_item WHERE job_id = ANY(:j)", j=jobs
            )
            return len(found) == 3 and all(i.status == "submitted" for i in found)

        await eventually(submitted, timeout=30, what="the three lines to be submitted")
        canceller = workflow_canceller(temporal_client)
        for job_id in jobs[1:]:
            await stack.service.cancel(job_id, "u-e", cancel_workflow=canceller)
            row = await stack.wait_status(job_id, timeout=30)
            assert row.lifecycle_status == "cancelled"
        # Ended, but their lines may still be answered and billed: still counted.
        assert await standing(db, "u-e") == (Decimal(0), worst * 3)
        assert await admitted_until_refused(stack, "u-e") == []
        await fake.arelease()
        row = await stack.wait_status(jobs[0], timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)

        async def charged() -> Any:
            found = await rows(db, "SELECT job_id FROM ai_usage_log")
            return found if len(found) == 3 else None

        usage = await eventually(charged, timeout=30, what="the three lines' charges")
        assert sorted(u.job_id for u in usage) == sorted(jobs)  # the cancelled ones' too
        spent, reserved = await standing(db, "u-e")
        assert reserved == 0 and worst * 2 < spent <= budget
        assert await admitted_until_refused(stack, "u-e") == []

        # A line that is never answered (its batch cancelled at the provider) charges nothing:
        # its job's hold ends with the batch.
        await fake.abatch_script(hold=True)
        lone = await create(stack, "u-f")
        await eventually(
            lambda: _item_status(db, lone, "submitted"), timeout=30, what="the line submitted"
        )
        await stack.service.cancel(lone, "u-f", cancel_workflow=canceller)
        await stack.wait_status(lone, timeout=30)

        async def released() -> bool:
            return await standing(db, "u-f") == (Decimal(0), Decimal(0))

        await eventually(released, timeout=30, what="the unanswered line's hold to end")
        assert await rows(db, "SELECT 1 FROM ai_usage_log WHERE job_id = :j", j=lone) == []


async def _item_status(db: SessionMaker, job_id: uuid.UUID, status: str) -> bool:
    found = await rows(db, "SELECT status FROM ai_batch_item WHERE job_id = :j", j=job_id)
    return [i.status for i in found] == [status]
