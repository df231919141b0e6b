"""A schedule's outbox events through the relay, on the real PostgreSQL and Temporal dev server
(no worker needed): a sync makes the Temporal schedule match the row (created, paused, deleted),
a trigger of a deleted schedule starts nothing, and a failed dispatch follows the outbox's rules
as any row's: a malformed event is `failed` at its first claim, alone; a sync Temporal refuses
backs off and is parked `dead` after 3 counted attempts, never lost."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from db import outbox as outbox_db
from db import schedules as schedules_db
from db.session import SessionMaker
from engine.definition import SYSTEM_QUEUE
from engine.schedules import (
    SCHEDULES_QUEUE,
    SYNC_EVENT,
    TRIGGER_EVENT,
    run_workflow_id,
    temporal_schedule_id,
)
from engine.settings import Settings
from runtime.schedules import RUN_SLOTS
from runtime.wiring import build_parts
from runtime.worker import build_workers
from tests.integration.engine_helpers import describe_or_none, execute, rows
from tests.stack import INTERACTIVE, Stack, engine_stack


async def add_schedule(db: SessionMaker, *, cron: str | None = None, paused: bool = False) -> Any:
    sid = uuid.uuid4()
    await execute(
        db,
        "INSERT INTO ai_schedule (id, user_id, job_type, target_type, target_id, input, "
        "interval_s, cron, paused) VALUES (:s, 'u1', 'synthetic', 'schedule', 't', "
        "'{}'::jsonb, :i, :c, :p)",
        s=sid,
        i=None if cron else 3600,
        c=cron,
        p=paused,
    )
    return sid


async def sync(db: SessionMaker, sid: uuid.UUID) -> None:
    async with db.begin() as s:
        await schedules_db.add_sync(s, sid)


async def statuses(db: SessionMaker, sid: uuid.UUID) -> list[tuple[str, str, int]]:
    found = await rows(
        db,
        "SELECT event_type, status, attempt_count FROM outbox_event WHERE aggregate_id = :a "
        "ORDER BY id",
        a=str(sid),
    )
    return [(r.event_type, r.status, r.attempt_count) for r in found]


async def temporal(client: Client, st: Stack, sid: uuid.UUID) -> Any:
    handle = client.get_schedule_handle(temporal_schedule_id(sid, st.settings.task_queue_suffix))
    try:
        return await handle.describe()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        return None


async def test_sync_events_make_temporal_match_the_row(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        sid = await add_schedule(db)
        await sync(db, sid)
        assert await st.relay.run_once() == 1
        desc = await temporal(temporal_client, st, sid)
        assert not desc.schedule.state.paused
        assert desc.schedule.action.task_queue == SCHEDULES_QUEUE + settings.task_queue_suffix
        await execute(db, "UPDATE ai_schedule SET paused = true WHERE id = :s", s=sid)
        await sync(db, sid)
        assert await st.relay.run_once() == 1
        assert (await temporal(temporal_client, st, sid)).schedule.state.paused
        await execute(db, "DELETE FROM ai_schedule WHERE id = :s", s=sid)
        await sync(db, sid)
        at = datetime.now(UTC)
        async with db.begin() as s:
            await schedules_db.add_trigger(s, sid, at)
        assert await st.relay.run_once() == 2
        assert await temporal(temporal_client, st, sid) is None
        # A trigger of a schedule deleted before its dispatch starts nothing.
        run_id = run_workflow_id(sid, at, settings.task_queue_suffix)
        assert await describe_or_none(temporal_client, run_id) is None
        assert await statuses(db, sid) == [
            (SYNC_EVENT, "published", 1),
            (SYNC_EVENT, "published", 1),
            (SYNC_EVENT, "published", 1),
            (TRIGGER_EVENT, "published", 1),
        ]


async def test_failed_schedule_events_follow_the_outbox_rules(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        good = await add_schedule(db, paused=True)
        # A row Temporal refuses (its cron was never checked: written behind the API's back).
        refused = await add_schedule(db, cron="61 * * * *")
        bad = uuid.uuid4()
        async with db.begin() as s:
            for payload in ({}, {"scheduleId": "not a uuid"}):
                await outbox_db.insert(
                    s,
                    event_type=SYNC_EVENT,
                    aggregate_type=schedules_db.AGGREGATE,
                    aggregate_id=str(bad),
                    dedupe_key=f"{SYNC_EVENT}:{uuid.uuid4()}",
                    payload=payload,
                )
            await outbox_db.insert(
                s,
                event_type=TRIGGER_EVENT,
                aggregate_type=schedules_db.AGGREGATE,
                aggregate_id=str(bad),
                dedupe_key=f"{TRIGGER_EVENT}:{uuid.uuid4()}",
                payload={"scheduleId": str(good), "scheduledAt": "yesterday"},
            )
            await schedules_db.add_sync(s, good)
            await schedules_db.add_sync(s, refused)
        assert await st.relay.run_once() == 5
        assert [x[1] for x in await statuses(db, bad)] == ["failed"] * 3
        assert await statuses(db, good) == [(SYNC_EVENT, "published", 1)]
        assert (await temporal(temporal_client, st, good)).schedule.state.paused
        for attempt in (1, 2, 3):
            status = "dead" if attempt == 3 else "pending"
            assert await statuses(db, refused) == [(SYNC_EVENT, status, attempt)]
            # The backoff, cut short.
            await execute(db, "UPDATE outbox_event SET available_at = now()")
            assert await st.relay.run_once() == (0 if attempt == 3 else 1)
        async with db() as s:
            error = (
                await s.execute(
                    text("SELECT last_error FROM outbox_event WHERE aggregate_id = :a"),
                    {"a": str(refused)},
                )
            ).scalar_one()
        assert error.startswith("RPCError")
        assert await temporal(temporal_client, st, refused) is None


async def test_runs_have_a_task_queue_and_slots_of_their_own(
    settings: Settings, temporal_client: Client
) -> None:
    """The `ai-system` process polls `ai-schedules` with a worker of its own: a backlog of runs
    waits there, never in the slots of the relay, the reconciler or the bulk operations."""
    parts = build_parts(settings)
    try:
        workers = build_workers(temporal_client, parts, [SYSTEM_QUEUE])
        by_queue = {w.task_queue: w.config() for w in workers}
        system, runs = (
            settings.task_queue(SYSTEM_QUEUE),
            SCHEDULES_QUEUE + settings.task_queue_suffix,
        )
        assert set(by_queue) == {system, runs}
        assert [w.__name__ for w in by_queue[runs]["workflows"]] == ["ScheduledRun"]
        assert by_queue[runs]["max_concurrent_activities"] == RUN_SLOTS
        # Serving no job queue builds no `ai-schedules` worker either.
        assert [w.task_queue for w in build_workers(temporal_client, parts, INTERACTIVE)] == [
            settings.task_queue(INTERACTIVE[0])
        ]
    finally:
        await parts.close()
