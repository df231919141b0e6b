"""Flow control end to end in the engine (real PostgreSQL and Temporal, the synthetic provider
under AI_MODEL_LIMITS): a job with a TTL waiting for the only concurrency slot expires on its
workflow's durable timer, with no call; a running job stops at its deadline, its call charged;
a plain job's run has no timer at all; the relay expires a job it never dispatched; a debounced
job is dispatched at its due time; an operator pause holds a user's job (no call, no slot, no
room in the dispatch window) across a restart of the whole engine, and its lifting runs it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import REGISTRY
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

from db.session import SessionMaker
from engine.flow import Concurrency, PauseMatch
from jobs.pauses import Pauses
from tests.integration.engine_helpers import (
    rows,
    scalar,
    wait_workflow_closed,
    workflow_canceller,
)
from tests.stack import JOB_QUEUES, engine_stack, make_settings
from tests.support import eventually

HOLD = {"delayMs": 9000}


def counted(name: str, label: str, value: str) -> float:
    return sum(
        s.value
        for m in REGISTRY.collect()
        for s in m.samples
        if s.name == name and s.labels.get(label) == value
    )


def flow_count(outcome: str) -> float:
    return counted("aijobs_flow_jobs_total", "outcome", outcome)


async def usage_rows(db: SessionMaker, job: uuid.UUID) -> int:
    return int(await scalar(db, "SELECT count(*) FROM ai_usage_log WHERE job_id = :j", j=job))


async def dispatched_at(db: SessionMaker, job: uuid.UUID) -> Any:
    return await scalar(db, "SELECT dispatched_at FROM ai_job WHERE id = :j", j=job)


async def timers(client: Client, wid: str) -> int:
    history = await client.get_workflow_handle(wid).fetch_history()
    return sum(1 for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED)


async def test_ttl_and_deadline_fire_on_durable_timers_and_a_plain_job_has_none(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(
        database_url,
        temporal_address,
        AI_MODEL_LIMITS=json.dumps({"synthetic": {"concurrency": 1}}),
        AI_INTERACTIVE_CONCURRENCY=4,
    )
    expired_before = flow_count("expired")
    async with engine_stack(settings, temporal_client) as st:
        plain = await st.create(input={"echo": {"plain": True}})
        await st.wait_status(plain, "succeeded")
        assert await timers(temporal_client, st.workflow_id(plain)) == 0

        holder = await st.create(input=HOLD)
        await st.wait_status(holder, "running")
        created = time.monotonic()
        late = await st.create(user_id="u2", ttl_seconds=3)
        row = await st.wait_status(late, "cancelled", timeout=15)
        took = time.monotonic() - created
        assert row.error_code == "JOB_EXPIRED" and row.started_at is None, row
        assert 2.5 <= took <= 6.0, took  # within 2 s of its TTL, on a loaded machine
        assert (await st.job(holder)).lifecycle_status == "running"  # the slot is still held
        assert await usage_rows(db, late) == 0
        assert flow_count("expired") == expired_before + 1
        assert row.expires_at is not None

        await st.wait_status(holder, "succeeded", timeout=30)
        assert await usage_rows(db, late) == 0  # no call once the slot freed either

        deadline = datetime.now(UTC) + timedelta(seconds=4)
        stopped = await st.create(input={"delayMs": 30_000}, deadline=deadline)
        await st.wait_status(stopped, "running")
        row = await st.wait_status(stopped, "cancelled", timeout=15)
        assert row.error_code == "JOB_DEADLINE_EXCEEDED", row
        assert row.finished_at is not None and row.finished_at <= deadline + timedelta(seconds=3)
        assert await usage_rows(db, stopped) == 1  # its call in flight, charged
        assert row.deadline_at == deadline

        # The owner's cancel still stops a job whose timers are armed, as it stops any job.
        armed = await st.create(
            input={"delayMs": 30_000}, ttl_seconds=600, deadline=deadline + timedelta(hours=1)
        )
        await st.wait_status(armed, "running")
        await st.service.cancel(armed, "u1", cancel_workflow=workflow_canceller(temporal_client))
        row = await st.wait_status(armed, "cancelled", timeout=15)
        assert row.error_code == "CANCELLED"
        desc = await wait_workflow_closed(temporal_client, st.workflow_id(armed))
        assert desc.status == WorkflowExecutionStatus.CANCELED


async def test_the_relay_expires_a_job_it_never_dispatched_and_starts_a_debounce_on_time(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(
        database_url, temporal_address, USER_DISPATCH_WINDOW=1, RELAY_POLL_INTERVAL_S=8
    )
    async with engine_stack(settings, temporal_client, queues=()) as st:
        await st.create()  # dispatched, never runs (no workers): the user's window is full
        waiting = await st.create(ttl_seconds=2)
        row = await st.wait_status(waiting, "cancelled", timeout=10)
        assert row.error_code == "JOB_EXPIRED" and await dispatched_at(db, waiting) is None
        assert (row.finished_at - row.expires_at).total_seconds() < 2.0

        debounced = await st.create(
            user_id="u2", concurrency=Concurrency("k", "debounce", delay_ms=2500)
        )

        async def dispatched() -> Any:
            return await dispatched_at(db, debounced)

        at = await eventually(dispatched, timeout=10, what="the debounced job's dispatch")
        after = (at - (await st.job(debounced)).created_at).total_seconds()
        assert 2.4 <= after <= 4.5, after  # at its due time, though the poll is 8 s


async def test_a_pause_holds_a_users_jobs_across_a_restart_until_it_is_lifted(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(database_url, temporal_address, USER_DISPATCH_WINDOW=1)
    admin = Pauses(db)
    held_before = flow_count("held")
    waits_before = counted("aijobs_limiter_waits_total", "reason", "operator_pause")
    pause = await admin.create(
        PauseMatch(user_id="held", job_type="synthetic"),
        reason="a misbehaving prompt",
        expires_at=None,
        actor="root",
    )
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        held = await st.create(user_id="held")
        other = await st.create(user_id="free")
        await st.wait_status(other, "succeeded")

        async def holding() -> bool:
            n = await scalar(db, "SELECT count(*) FROM ai_pause_hold WHERE job_id = :j", j=held)
            return bool(n)

        await eventually(holding, timeout=15, what="the job held by the pause")
        # Held, it takes no room in its user's window (1): the user's next job runs.
        second = await st.create(user_id="held", job_type="quiz_generation", input=_quiz())
        await st.wait_status(second, "succeeded", timeout=30)
        row = await st.job(held)
        assert (row.lifecycle_status, row.started_at) == ("queued", None)
        assert await usage_rows(db, held) == 0
        assert flow_count("held") == held_before + 1  # once, however often it looks
        assert counted("aijobs_limiter_waits_total", "reason", "operator_pause") == waits_before + 1
    # The whole engine stops and starts again on the same data: still held.
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        await asyncio.sleep(1.0)
        assert (await st.job(held)).lifecycle_status == "queued"
        assert [p.id for p in await admin.listed()] == [pause.id]
        lifted = time.monotonic()
        await admin.delete(pause.id, actor="root")
        await st.wait_status(held, "succeeded", timeout=20)
        assert time.monotonic() - lifted < 10
        assert await usage_rows(db, held) == 1  # it ran once
    audit = await rows(db, "SELECT actor, action FROM admin_audit ORDER BY id")
    assert [(a.actor, a.action) for a in audit] == [
        ("root", "pause.create"),
        ("root", "pause.delete"),
    ]


def _quiz() -> dict[str, Any]:
    return {"sourceText": "Photosynthesis converts light energy into chemical energy.", "count": 1}
