"""The batch tier's rows under concurrency, on real PostgreSQL with real concurrent connections
(db/batches.py, db/batch_uploads.py, db/budgets.py):

- an enroll closes the open batch when its line would pass a cap, and a batch at the line cap
  closes at once;
- a leave waits for a close in progress (both take the batch's row lock) and then sees the
  batch closed: its item stays to get its outcome, and its job's reservation stays open until
  the outcome is recorded, counted once;
- the first upload start ends the items whose jobs left before it, and fixes the file's lines;
- a batch's files are due for deletion at the provider once no job waits for them and either
  its results are stored or every job of it was purged; an orphan upload at once.
"""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal
from typing import Any

from sqlalchemy import text

from db import batch_files as files_db
from db import batch_results as results_db
from db import batch_uploads as uploads_db
from db import batches as batches_db
from db import budgets as budgets_db
from db import lifecycle as lifecycle_db
from db import retention as retention_db
from db.batches import BatchCaps, Enrolled, custom_id_of
from db.lifecycle import NewJob
from db.provider_gate import PLATFORM_KEY_REF
from db.session import SessionMaker
from providers.batch_lines import encode_line
from tests.support import eventually

BODY = {"model": "m", "messages": [{"role": "user", "content": "x" * 100}], "max_tokens": 9}
WORST = Decimal("0.01")


async def new_job(db: SessionMaker, user: str = "u-rows") -> uuid.UUID:
    job_id = uuid.uuid4()
    job = NewJob(
        id=job_id,
        user_id=user,
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
        workflow_id=f"test-rows:{job_id}",
        service_tier="batch",
        reserved_cost_usd=WORST,
    )
    async with db.begin() as s:
        await lifecycle_db.create(s, job)
    return job_id


async def enroll(db: SessionMaker, job_id: uuid.UUID, caps: BatchCaps) -> Enrolled:
    async with db.begin() as s:
        return await batches_db.enroll(
            s,
            job_id=job_id,
            attempt=1,
            provider="openai_compatible",
            model="m",
            key_ref=PLATFORM_KEY_REF,
            task_queue="q-rows",
            body=BODY,
            line_bytes=len(encode_line(custom_id_of(job_id, 1), BODY)),
            caps=caps,
        )


async def reserved(db: SessionMaker, user: str = "u-rows") -> Decimal:
    async with db() as s:
        return (await budgets_db.standing(s, user, reserved=True)).reserved_usd


async def end_job(db: SessionMaker, job_id: uuid.UUID) -> None:
    """The job ends cancelled (as its finalizer ends it), straight in SQL."""
    async with db.begin() as s:
        await s.execute(
            text(
                "UPDATE ai_job SET lifecycle_status = 'cancelled', finished_at = now() "
                "WHERE id = :j"
            ),
            {"j": job_id},
        )


async def test_an_enroll_past_a_cap_closes_the_open_batch_and_a_full_one_closes_at_once(
    db: SessionMaker,
) -> None:
    line = len(encode_line(custom_id_of(uuid.uuid4(), 1), BODY))
    caps = BatchCaps(max_lines=3, max_bytes=line * 2)
    got = [await enroll(db, await new_job(db), caps) for _ in range(5)]
    # Bytes: two lines a batch; the third line closes the first batch and opens the next.
    assert [g.batch_id for g in got] == [got[0].batch_id] * 2 + [got[2].batch_id] * 2 + [
        got[4].batch_id
    ]
    assert [[c.batch_id for c in g.closed] for g in got] == [
        [],
        [],
        [got[0].batch_id],
        [],
        [got[2].batch_id],
    ]
    lines_capped = BatchCaps(max_lines=2, max_bytes=10**9)
    more = [await enroll(db, await new_job(db), lines_capped) for _ in range(2)]
    assert more[0].batch_id == got[4].batch_id
    assert [c.batch_id for c in more[0].closed] == [got[4].batch_id]  # reached 2: closed
    assert more[1].batch_id != more[0].batch_id and more[1].closed == ()
    async with db() as s:
        statuses = [
            (await batches_db.get(s, b)).status  # type: ignore[union-attr]
            for b in (got[0].batch_id, got[2].batch_id, got[4].batch_id, more[1].batch_id)
        ]
    assert statuses == ["submitting", "submitting", "submitting", "open"]


async def test_a_leave_waits_for_the_close_and_its_job_stays_counted_until_the_outcome(
    db: SessionMaker,
) -> None:
    jobs = [await new_job(db) for _ in range(3)]
    got = [await enroll(db, j, BatchCaps()) for j in jobs]
    bid = got[0].batch_id
    assert await reserved(db) == WORST * 3
    # The close holds the batch's row lock while the leave arrives on another connection.
    async with db.begin() as closing:
        await batches_db.close(closing, bid)
        leaving = asyncio.ensure_future(_leave(db, jobs[0]))
        await eventually(lambda: _waiting_on_a_lock(db), timeout=10, what="the leave to wait")
        assert not leaving.done()  # waits for the close's lock
    left = await leaving
    assert left is not None and left.batch_status == "submitting" and not left.all_cancelled
    await end_job(db, jobs[0])
    # Ended, yet its line may be sent: counted once, as an open reservation.
    assert await reserved(db) == WORST * 3
    # A second job leaves after the close too.
    await _leave(db, jobs[1])
    await end_job(db, jobs[1])
    assert await reserved(db) == WORST * 3
    async with db.begin() as s:
        up = await uploads_db.start_upload(s, bid)
    assert up is not None and up.first
    async with db.begin() as s:
        size = await uploads_db.file_size(s, bid)
        assert (size.lines, size.bytes, size.unsized) == (1, up.batch.byte_count // 3, 0)
        assert [f.custom_id async for f in uploads_db.file_lines(s, bid)] == [got[2].custom_id]
    # Neither left job's line is in the file: both holds ended at the upload's start, uncharged.
    assert await reserved(db) == WORST
    # The file's lines are fixed: a later start changes nothing.
    async with db.begin() as s:
        again = await uploads_db.start_upload(s, bid)
    assert again is not None and not again.first


async def test_a_held_job_is_released_by_its_lines_outcome_with_its_charge(
    db: SessionMaker,
) -> None:
    jobs = [await new_job(db, "u-held") for _ in range(2)]
    got = [await enroll(db, j, BatchCaps()) for j in jobs]
    bid = got[0].batch_id
    async with db.begin() as s:
        await batches_db.close(s, bid)
        await uploads_db.start_upload(s, bid)
        await batches_db.mark_submitted(s, bid, provider_batch_id="b", input_file_id="f")
    await _leave(db, jobs[0])
    await end_job(db, jobs[0])
    assert await reserved(db, "u-held") == WORST * 2
    async with db.begin() as s:
        settled = await results_db.settle(
            s, bid, got[0].custom_id, status="succeeded", response={"x": 1}, error_code=None
        )
        again = await results_db.settle(
            s, bid, got[0].custom_id, status="succeeded", response={"x": 1}, error_code=None
        )
    assert settled is not None and settled.status == "cancelled" and again is None
    assert await reserved(db, "u-held") == WORST  # the live job only
    async with db.begin() as s:
        await results_db.fail_items(s, bid, "PROVIDER_UNAVAILABLE")
    items = await _items(db, bid)
    assert items == {got[0].custom_id: ("cancelled", True), got[1].custom_id: ("failed", True)}


async def _waiting_on_a_lock(db: SessionMaker) -> bool:
    async with db() as s:
        n = await s.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
        )
    return bool(n)


async def _leave(db: SessionMaker, job_id: uuid.UUID) -> Any:
    async with db.begin() as s:
        return await batches_db.leave(s, job_id)


async def _items(db: SessionMaker, bid: uuid.UUID) -> dict[str, tuple[str, bool]]:
    async with db() as s:
        found = await s.execute(
            text("SELECT custom_id, status, ended_at FROM ai_batch_item WHERE batch_id = :b"),
            {"b": bid},
        )
        return {r.custom_id: (r.status, r.ended_at is not None) for r in found}


async def test_files_are_due_once_no_job_waits_and_results_are_stored_or_purged(
    db: SessionMaker,
) -> None:
    jobs = [await new_job(db, "u-files") for _ in range(2)]
    got = [await enroll(db, j, BatchCaps()) for j in jobs]
    bid = got[0].batch_id
    async with db.begin() as s:
        await batches_db.close(s, bid)
        await uploads_db.start_upload(s, bid)
        await batches_db.mark_submitted(s, bid, provider_batch_id="b", input_file_id="f-in")
        await files_db.record(s, bid, [("f-in", files_db.INPUT), ("f-dup", files_db.ORPHAN)])

    async def due() -> list[str]:
        async with db() as s:
            return sorted(f.file_id for f in await files_db.due(s))

    assert await due() == ["f-dup"]  # an orphan at once; the input holds live lines
    for job_id in jobs:
        await _leave(db, job_id)
        await end_job(db, job_id)
    assert await due() == ["f-dup"]  # nobody waits, but the results are not stored
    async with db.begin() as s:  # one job purged: the other's results are still wanted
        await retention_db.purge_jobs(s, [jobs[0]])
    assert await due() == ["f-dup"]
    async with db.begin() as s:
        await retention_db.purge_jobs(s, [jobs[1]])
    assert await due() == ["f-dup", "f-in"]
    async with db.begin() as s:
        await files_db.delete_failed(s, bid, "f-in")
        await files_db.deleted(s, bid, "f-dup")
    assert await due() == []  # deleted, or waiting for its next try
    async with db() as s:
        tried = await s.scalar(
            text("SELECT next_try_at - now() FROM ai_batch_file WHERE file_id = 'f-in'")
        )
    assert tried is not None and 25 < tried.total_seconds() <= 30
