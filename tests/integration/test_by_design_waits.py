"""By-design waits take no room in the user dispatch window (db/relay.py `BY_DESIGN_WAITS`): a
delayed job is not dispatched before its due time and holds no room meanwhile, the claim says
when the next one is due and makes it due once its time has passed, due jobs go out in their
user's priority order; a reuser waiting on its active source takes no room; and a standard
create never waits on a source of a slower tier (jobs/reuse.py `patient`). Times are moved
with SQL (a due time set in the past), never waited for."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from db import lifecycle as lifecycle_db
from db import relay as relay_db
from db import reuse as reuse_db
from db.session import SessionMaker
from tests.integration.engine_helpers import new_job
from tests.integration.window_helpers import claimed, create, end


async def delayed(db: SessionMaker, user: str, *, ahead_s: float, priority: int = 50) -> uuid.UUID:
    """A job created with runAt `ahead_s` from now."""
    return await create(db, user, priority, due=datetime.now(UTC) + timedelta(seconds=ahead_s))


async def scalar(db: SessionMaker, sql: str, **kw: Any) -> Any:
    async with db() as s:
        return (await s.execute(text(sql), kw)).scalar()


async def time_passes(db: SessionMaker, *ids: uuid.UUID) -> None:
    """The jobs' due time (and their rows') is now in the past."""
    async with db.begin() as s:
        await s.execute(
            text("UPDATE ai_job SET due_at = now() - interval '1 second' WHERE id = ANY(:ids)"),
            {"ids": list(ids)},
        )
        await s.execute(
            text(
                "UPDATE outbox_event SET available_at = now() - interval '1 second' "
                "WHERE aggregate_id = ANY(:ids)"
            ),
            {"ids": [str(i) for i in ids]},
        )


async def test_delayed_jobs_take_no_room_and_the_claim_says_when_the_next_is_due(
    db: SessionMaker,
) -> None:
    later = [await delayed(db, "u", ahead_s=600) for _ in range(5)]
    soon = await delayed(db, "u", ahead_s=30)
    now = await create(db, "u")
    rows = await relay_db.claim(db, owner="relay-t", limit=100, window=4)
    # The job without runAt goes out at once: five delayed jobs of its user hold no room.
    assert [uuid.UUID(r.aggregate_id) for r in rows] == [now]
    assert rows.due_in_s is not None and 25 < rows.due_in_s <= 30
    waiting = await scalar(
        db,
        "SELECT count(*) FROM ai_job WHERE dispatched_at IS NULL AND due_at IS NOT NULL "
        "AND id = ANY(:ids)",
        ids=[*later, soon],
    )
    assert waiting == 6
    # Nothing is held either: their rows are not even looked at before their time.
    held = await scalar(db, "SELECT count(*) FROM outbox_event WHERE held_at IS NOT NULL")
    assert held == 0
    empty = await relay_db.claim(db, owner="relay-t", limit=100, window=4)
    assert list(empty) == [] and empty.due_in_s is not None


async def test_due_jobs_go_out_in_priority_order_within_the_window(db: SessionMaker) -> None:
    running = [await create(db, "u") for _ in range(2)]
    assert await claimed(db, window=3) == running
    low = await delayed(db, "u", ahead_s=60, priority=90)
    urgent = await delayed(db, "u", ahead_s=120, priority=0)
    plain = await create(db, "u", priority=50)
    assert await claimed(db, window=3) == [plain]  # the window is full now
    await time_passes(db, low, urgent)
    assert await claimed(db, window=3) == []  # due, and held by the full window
    assert await scalar(db, "SELECT count(*) FROM ai_job WHERE due_at IS NOT NULL") == 0
    await end(db, running[0])
    assert await claimed(db, window=3) == [urgent]  # its user's priority first
    await end(db, running[1])
    assert await claimed(db, window=3) == [low]


async def test_a_due_job_whose_row_is_locked_waits_for_the_next_claim(db: SessionMaker) -> None:
    job = await delayed(db, "u", ahead_s=60)
    await time_passes(db, job)
    async with db.begin() as s:  # a cancel holding the job's row
        await s.execute(text("SELECT 1 FROM ai_job WHERE id = :id FOR UPDATE"), {"id": job})
        assert await claimed(db, window=2) == []  # skipped, not waited for
    assert await claimed(db, window=2) == [job]


async def reuser(db: SessionMaker, source: uuid.UUID) -> uuid.UUID:
    """A dispatched job that waits on `source`'s answer (queued, its workflow started)."""
    job = await create(db, "u")
    async with db.begin() as s:
        await s.execute(
            text("UPDATE ai_job SET reused_from_job_id = :src WHERE id = :id"),
            {"src": source, "id": job},
        )
    return job


async def test_a_reuser_waiting_on_its_source_takes_no_room(db: SessionMaker) -> None:
    source = await create(db, "u")
    assert await claimed(db, window=2) == [source]
    waiters = [await reuser(db, source) for _ in range(3)]
    assert await claimed(db, window=2) == waiters[:1]  # the source counts, not its waiters
    assert await claimed(db, window=2) == waiters[1:2]
    assert await claimed(db, window=2) == waiters[2:]
    other = await create(db, "u")
    assert await claimed(db, window=2) == [other]
    late = await create(db, "u")
    assert await claimed(db, window=2) == []  # the source and `other`
    await end(db, source)
    # The source ended: its waiters are no longer waiting on it, they count again (each takes
    # its answer, or makes its own call), and nothing more goes out until they end.
    await end(db, other)
    assert await claimed(db, window=2) == []
    await end(db, *waiters)
    assert await claimed(db, window=2) == [late]


async def reuse_source(db: SessionMaker, **columns: Any) -> uuid.UUID:
    row = dataclasses.replace(new_job("u"), reuse_key="k" * 64, **columns)
    async with db.begin() as s:
        await lifecycle_db.create(s, row)
    return row.id


async def candidate(db: SessionMaker, *, patient: bool) -> uuid.UUID | None:
    async with db() as s:
        found = await reuse_db.candidate(
            s, user_id="u", job_type="synthetic", reuse_key="k" * 64, patient=patient
        )
    return found.id if found else None


async def test_a_standard_create_never_waits_on_a_slower_source(db: SessionMaker) -> None:
    batch = await reuse_source(db, service_tier="batch")
    assert await candidate(db, patient=False) is None  # makes its own call
    assert await candidate(db, patient=True) == batch  # a batch job may wait on a batch job
    soon = datetime.now(UTC) + timedelta(hours=1)
    delayed_source = await reuse_source(db, run_at=soon, due_at=soon)
    assert await candidate(db, patient=False) is None
    assert await candidate(db, patient=True) == delayed_source
    offpeak = await reuse_source(db, service_tier="offpeak")
    assert await candidate(db, patient=False) is None
    assert await candidate(db, patient=True) == offpeak
    standard = await reuse_source(db)
    assert await candidate(db, patient=False) == standard
