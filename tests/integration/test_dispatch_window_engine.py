"""The user dispatch window on the engine (relay, worker, Temporal): a user's urgent job created
after their low-priority backlog runs before the rest of it, another user's job is not held
behind that backlog, a held job is cancelled at once and its enqueue row closed, and delayed
jobs hold no room until their time, when they start without waiting for a poll."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from tests.stack import engine_stack, make_settings
from tests.support import eventually


async def finished_order(db: SessionMaker, ids: list[uuid.UUID]) -> list[uuid.UUID]:
    async with db() as s:
        rows = await s.execute(
            text(
                "SELECT id FROM ai_job WHERE id = ANY(:ids) AND lifecycle_status = 'succeeded' "
                "ORDER BY finished_at, id"
            ),
            {"ids": ids},
        )
        return [r.id for r in rows]


async def test_priority_orders_a_users_own_jobs_and_no_one_elses(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(
        database_url, temporal_address, USER_DISPATCH_WINDOW=1, AI_INTERACTIVE_CONCURRENCY=1
    )
    async with engine_stack(settings, temporal_client) as st:
        low = [
            await st.create(user_id="heavy", priority=90, input={"delayMs": 150}) for _ in range(4)
        ]
        cancelled = await st.create(user_id="heavy", priority=50, input={"delayMs": 150})
        urgent = await st.create(user_id="heavy", priority=0, input={"delayMs": 150})
        light = await st.create(user_id="light", input={"delayMs": 150})
        # Held: still queued, its enqueue row pending; cancelled at once all the same.
        assert (await st.job(cancelled)).lifecycle_status == "queued"
        out = await st.service.cancel(cancelled, "heavy")
        assert out.outcome == "cancelled"

        async def closed() -> bool:
            async with db() as s:
                status = (
                    await s.execute(
                        text("SELECT status FROM outbox_event WHERE aggregate_id = :a"),
                        {"a": str(cancelled)},
                    )
                ).scalar()
            return status == "published"

        for job in [*low, urgent, light]:
            await st.wait_status(job, "succeeded", timeout=60)
        await eventually(closed, timeout=15, what="the cancelled held job's row closed")
        order = await finished_order(db, [*low, urgent, light])
        # The heavy user's urgent job, created after 4 low ones, ran right after the one
        # already dispatched; the light user's job was not held behind any of them.
        assert order.index(urgent) <= 2, order
        assert order.index(light) <= 2, order
        assert (await st.job(cancelled)).lifecycle_status == "cancelled"


async def test_delayed_jobs_hold_no_room_and_start_at_their_time(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    """Five jobs due in ten minutes do not hold their user's job without runAt (window 4); a
    job due in three seconds starts then, woken by its due time: the relay's poll is a
    minute."""
    settings = make_settings(
        database_url, temporal_address, USER_DISPATCH_WINDOW=4, RELAY_POLL_INTERVAL_S=60
    )
    async with engine_stack(settings, temporal_client) as st:
        later = [
            await st.create(user_id="u", run_at=datetime.now(UTC) + timedelta(minutes=10))
            for _ in range(5)
        ]
        soon_at = datetime.now(UTC) + timedelta(seconds=3)
        soon = await st.create(user_id="u", run_at=soon_at)
        now = await st.create(user_id="u")
        await st.wait_status(now, "succeeded", timeout=30)
        done = await st.wait_status(soon, "succeeded", timeout=30)
        assert soon_at <= done.started_at <= soon_at + timedelta(seconds=2), done.started_at
        async with db() as s:
            waiting = (
                await s.execute(
                    text(
                        "SELECT count(*) FROM ai_job WHERE id = ANY(:ids) "
                        "AND lifecycle_status = 'queued' AND dispatched_at IS NULL"
                    ),
                    {"ids": later},
                )
            ).scalar()
        assert waiting == 5


async def test_only_a_users_window_of_jobs_waits_in_a_limits_queue(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    """One user's 12 jobs behind a held concurrency slot at the default window (4): the 4
    dispatched wait in the key's queue (their EXECUTE looked once and sleeps until a wake-up or
    its backstop), the 8 others wait in the outbox, held, with no workflow: a wait for a limit
    costs nothing per job beyond the window."""
    settings = make_settings(
        database_url,
        temporal_address,
        USER_DISPATCH_WINDOW=4,
        AI_INTERACTIVE_CONCURRENCY=4,
        AI_MODEL_LIMITS='{"synthetic": {"concurrency": 1}}',
    )
    async with engine_stack(settings, temporal_client) as st:
        holder = await st.create(user_id="holder", input={"delayMs": 15_000})
        await st.wait_status(holder, "running")
        jobs = [await st.create(user_id="u") for _ in range(12)]

        async def four_waiting() -> bool:
            async with db() as s:
                n = (await s.execute(text("SELECT count(*) FROM limit_waiter"))).scalar()
            return n == 4

        await eventually(four_waiting, timeout=30, what="the window's jobs in the key's queue")
        async with db() as s:
            held = (
                await s.execute(
                    text(
                        "SELECT count(*) FROM ai_job WHERE id = ANY(:ids) "
                        "AND dispatched_at IS NULL AND lifecycle_status = 'queued'"
                    ),
                    {"ids": jobs},
                )
            ).scalar()
        assert held == 8
