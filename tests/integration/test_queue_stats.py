"""The queue tables' statistics on the real PostgreSQL (db/queue_stats.py,
activities/relay_stats.py): statistics taken while every job had ended make the claim read the
backlog once per waiting user during the next burst; a refresh after a slow claim brings it back
to a few buffers per job. A refresh analyzes only tables that changed, and a fast claim never
asks for one."""

from __future__ import annotations

from sqlalchemy import text

from activities.relay_stats import RECHECK_S, QueueStats
from bench.claim_plan import explain_claim
from db import queue_stats
from db.session import SessionMaker
from tests.integration.window_helpers import claimed, create, end
from tests.support import eventually

USERS = 64


async def _analyzed(db: SessionMaker) -> dict[str, int]:
    async with db() as s:
        rows = await s.execute(
            text(
                "SELECT relname, analyze_count + autoanalyze_count FROM pg_stat_user_tables "
                "WHERE relname IN ('ai_job', 'outbox_event')"
            )
        )
        return {str(r[0]): int(r[1]) for r in rows}


async def _changes_counted(db: SessionMaker, at_least: int) -> None:
    """Until both tables' changes since their statistics reach `at_least` (each backend reports
    its counts to the statistics system within about a second)."""

    async def counted() -> bool:
        async with db() as s:
            n = (
                await s.execute(
                    text(
                        "SELECT min(n_mod_since_analyze) FROM pg_stat_user_tables "
                        "WHERE relname IN ('ai_job', 'outbox_event')"
                    )
                )
            ).scalar()
        return n is not None and int(n) >= at_least

    await eventually(counted, timeout=10, what=f"{at_least} changes counted")


async def _stale_burst(db: SessionMaker, jobs: int) -> None:
    """Statistics of a table of ended jobs, then a burst of `jobs` waiting jobs, some claimed
    and run as the relay drains them."""
    for i in range(100):
        await create(db, f"before-u{i % USERS}")
    await end(db, *await claimed(db, window=100, limit=100))
    async with db.begin() as s:
        await s.execute(text("ANALYZE ai_job, outbox_event"))
        await s.execute(text("TRUNCATE ai_job, outbox_event CASCADE"))
    for i in range(jobs):
        await create(db, f"burst-u{i % USERS}")
    for _ in range(4):
        await end(db, *await claimed(db, window=4, limit=16))
    await _changes_counted(db, jobs)


async def test_a_refresh_after_a_slow_claim_brings_the_claim_back_to_its_plan(
    db: SessionMaker,
) -> None:
    jobs = 500
    await _stale_burst(db, jobs)
    stale, rows, _ = await explain_claim(db, 16)
    assert rows == 16

    stats = QueueStats(db, slow_s=0.0)
    stats.after_claim(0.03)  # a claim that took 30 ms
    await stats.wait()
    assert sorted(stats.analyzed) == ["ai_job", "outbox_event"]
    fresh, rows, _ = await explain_claim(db, 16)
    assert rows == 16
    # About 50,000 buffers over stale statistics (the backlog read once per waiting user), a
    # few thousand after the refresh.
    assert fresh < 10 * jobs, f"{fresh} buffers after the refresh ({stale} before)"
    assert fresh * 3 < stale, f"{fresh} buffers after the refresh, {stale} before"


async def test_only_changed_tables_are_analyzed_and_a_fast_claim_asks_for_nothing(
    db: SessionMaker,
) -> None:
    for i in range(250):
        await create(db, f"u{i % USERS}")
    await _changes_counted(db, 250)
    before = await _analyzed(db)
    for table in queue_stats.TABLES:
        async with db.begin() as s:
            assert await queue_stats.refresh(s, table, min_changes=200)
        async with db.begin() as s:
            assert not await queue_stats.refresh(s, table, min_changes=200)  # nothing since
    after = await _analyzed(db)
    assert {t: after[t] - before.get(t, 0) for t in after} == {"ai_job": 1, "outbox_event": 1}

    for i in range(250):
        await create(db, f"v{i % USERS}")
    await _changes_counted(db, 250)
    fast = QueueStats(db)
    fast.after_claim(0.005)
    await fast.wait()
    assert fast.analyzed == []
    # ...and at most one refresh per interval, however many slow claims.
    slow = QueueStats(db, slow_s=0.0, every_s=3600.0)
    slow.after_claim(1.0)
    await slow.wait()
    slow.after_claim(1.0)
    await slow.wait()
    assert sorted(slow.analyzed) == ["ai_job", "outbox_event"]


async def test_a_slow_claim_before_a_bursts_changes_are_counted_looks_again_soon(
    db: SessionMaker,
) -> None:
    """A burst's first slow claims come before the statistics system counted its creates (each
    backend reports at most once a second): the look finds too few changes, and the next slow
    claim looks again once `RECHECK_S` has passed, not at the next refresh interval."""
    async with db.begin() as s:
        await s.execute(text("ANALYZE ai_job, outbox_event"))
    now = [1000.0]
    stats = QueueStats(db, slow_s=0.0, every_s=3600.0, clock=lambda: now[0])
    stats.after_claim(1.0)
    await stats.wait()
    assert stats.analyzed == []  # nothing counted yet
    for i in range(250):
        await create(db, f"u{i % USERS}")
    await _changes_counted(db, 250)
    now[0] += RECHECK_S / 2
    stats.after_claim(1.0)
    await stats.wait()
    assert stats.analyzed == []  # too soon to look again
    now[0] += RECHECK_S / 2
    stats.after_claim(1.0)
    await stats.wait()
    assert sorted(stats.analyzed) == ["ai_job", "outbox_event"]
    assert RECHECK_S <= 1.0  # within about a second of the burst's creates being counted


async def test_one_refresh_at_a_time_across_processes(db: SessionMaker) -> None:
    """Another relay's refresh in progress (its transaction holds the lock): this one skips,
    without waiting, and refreshes once that one has ended."""
    for i in range(250):
        await create(db, f"w{i % USERS}")
    await _changes_counted(db, 250)
    async with db() as other, other.begin():
        await other.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended('aijobs:queue-analyze', 0))")
        )
        async with db.begin() as s:
            assert not await queue_stats.refresh(s, "ai_job", min_changes=200)
    async with db.begin() as s:
        assert await queue_stats.refresh(s, "ai_job", min_changes=200)
