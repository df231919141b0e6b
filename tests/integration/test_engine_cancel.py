"""Cancellation on the real PostgreSQL and Temporal dev server: a queued job never runs
(cancelled before dispatch, it never gets a workflow), a running job stops within seconds, and
a cancel racing a completion leaves exactly one terminal state on which SQL and Temporal
agree."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter

import pytest
from sqlalchemy import text
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

from db.outbox import CANCELLED, COMPLETED, ENQUEUE, FAILED
from db.session import SessionMaker
from engine.contracts import JobWorkflowResult
from engine.errors import JobAlreadyCancelled, JobNotCancellable
from engine.settings import Settings
from jobs.types import synthetic
from tests.integration.engine_helpers import (
    LIFECYCLE_SA,
    describe_or_none,
    job_facts,
    local_stages,
    wait_activity_started,
    wait_jobs,
    wait_workflow_closed,
    workflow_canceller,
)
from tests.stack import TERMINAL, engine_stack, make_settings, variant
from tests.support import eventually


async def enqueue_row(db: SessionMaker, job_id: uuid.UUID) -> tuple[str, str | None]:
    """(status, last_error) of the job's enqueue row."""
    async with db() as s:
        row = (
            await s.execute(
                text(
                    "SELECT status, last_error FROM outbox_event "
                    "WHERE event_type = :e AND aggregate_id = :j"
                ),
                {"e": ENQUEUE, "j": str(job_id)},
            )
        ).one()
    return row.status, row.last_error


def closed_unsent(row: tuple[str, str | None]) -> bool:
    """The enqueue row was closed by the cancel, before any relay took it."""
    return row == ("published", "closed: job ended before it was dispatched")


async def test_queued_job_cancelled_never_runs(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """A job cancelled before dispatch never gets a workflow (the cancel closes its enqueue
    row); one cancelled after its workflow started, before a worker ran it, ends at PREPARE."""
    # A relay and no worker: `dispatched` gets its workflow started, and nothing runs it.
    async with engine_stack(settings, temporal_client, queues=()) as st:
        dispatched = await st.create(input={"delayMs": 0})
        await eventually(
            lambda: _published(db, dispatched), what="the workflow started", timeout=30
        )
    # No relay and no worker: `undispatched` can only be queued when it is cancelled.
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        undispatched = await st.create(input={"delayMs": 0})
        for job_id in (undispatched, dispatched):
            result = await st.service.cancel(job_id, "u1")
            assert result.outcome == "cancelled"
            row = await st.job(job_id)
            assert row.lifecycle_status == "cancelled" and row.error_code == "CANCELLED"
            with pytest.raises(JobAlreadyCancelled):
                await st.service.cancel(job_id, "u1")
        # Closed in the cancel's transaction: no relay will ever start its workflow.
        assert closed_unsent(await enqueue_row(db, undispatched))
        assert await enqueue_row(db, dispatched) == ("published", None)

    # Now a relay and a worker: PREPARE finds `dispatched` cancelled and its workflow ends
    # there, before RESOLVE and before any provider slot.
    async with engine_stack(settings, temporal_client) as st:
        wid = st.workflow_id(dispatched)
        desc = await wait_workflow_closed(temporal_client, wid)
        assert desc.status == WorkflowExecutionStatus.COMPLETED
        res = await temporal_client.get_workflow_handle(wid, result_type=JobWorkflowResult).result()
        assert res == JobWorkflowResult(str(dispatched), "cancelled")
        assert desc.typed_search_attributes.get(LIFECYCLE_SA) == "cancelled"

        history = await temporal_client.get_workflow_handle(wid).fetch_history()
        scheduled = [
            e
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        ]
        assert scheduled == []  # no EXECUTE: the job never asked for a slot
        assert [s for s in local_stages(history) if s.startswith("finalize")] == []

        # A job created after them ran: the relay has claimed since, and passed the closed row.
        later = await st.create(input={"delayMs": 0})
        await st.wait_status(later, "succeeded", timeout=30)
        assert await describe_or_none(temporal_client, st.workflow_id(undispatched)) is None

        for job_id in (dispatched, undispatched):
            row = await st.job(job_id)
            assert row.lifecycle_status == "cancelled"
            assert row.started_at is None and row.locked_by is None and row.progress == 0
            f = await job_facts(db, job_id)
            assert f.usage == [] and f.artifacts == [] and COMPLETED not in f.events
            assert f.events.get(CANCELLED) == 1


async def _published(db: SessionMaker, job_id: uuid.UUID) -> bool:
    return (await enqueue_row(db, job_id))[0] == "published"


async def test_running_job_cancel_ends_within_seconds(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client) as st:
        job_id = await st.create(input={"hang": True})
        wid = st.workflow_id(job_id)
        await st.wait_status(job_id, "running")
        await wait_activity_started(temporal_client, wid, "execute")

        t0 = time.monotonic()
        result = await st.service.cancel(
            job_id, "u1", cancel_workflow=workflow_canceller(temporal_client)
        )
        assert result.outcome == "cancel_requested"
        row = await st.wait_status(job_id, timeout=20)
        elapsed = time.monotonic() - t0
        assert row.lifecycle_status == "cancelled", (row.error_code, row.internal_error_message)
        assert elapsed < 6.0, f"cancel took {elapsed:.1f}s"
        assert row.error_code == "CANCELLED" and row.cancel_requested_at is not None

        desc = await wait_workflow_closed(temporal_client, wid)
        assert desc.status == WorkflowExecutionStatus.CANCELED
        assert desc.typed_search_attributes.get(LIFECYCLE_SA) == "cancelled"
        f = await job_facts(db, job_id)
        assert f.artifacts == [] and f.synthetic_results == []
        assert f.usage == [(1, "CANCELLED")]  # the aborted call is still accounted for
        assert f.events.get(CANCELLED) == 1 and COMPLETED not in f.events


RACE_JOBS = 50
RACE_BATCH = 25


async def test_cancel_racing_completion_leaves_one_terminal_state(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    """50 short jobs, each cancelled at another moment of its life (queued, during EXECUTE,
    right when its output is stored so racing PROJECT's commit, or later): each ends in exactly
    one terminal state, and SQL, the outbox and Temporal tell the same story."""
    settings = make_settings(database_url, temporal_address, AI_INTERACTIVE_CONCURRENCY=RACE_BATCH)
    rng = random.Random(4)
    outcomes: dict[uuid.UUID, str] = {}

    async with engine_stack(settings, temporal_client) as st:
        cancel_wf = workflow_canceller(temporal_client)

        async def reached(job_id: uuid.UUID, stage: str) -> None:
            """Until the job is running (`running`) or its output is stored (`executed`:
            EXECUTE done, PROJECT next), or it ended."""

            async def probe() -> bool:
                row = await st.job(job_id)
                if row.lifecycle_status in TERMINAL:
                    return True
                if stage == "running":
                    return bool(row.lifecycle_status == "running")
                return row.output_hash is not None

            await eventually(probe, timeout=30, what=f"{job_id} {stage}", interval=0.02)

        async def one(i: int) -> uuid.UUID:
            job_id = await st.create(input={"delayMs": rng.choice([0, 0, 20, 100])})
            kind = i % 5
            if kind == 1:  # during EXECUTE (or just before / after it)
                await reached(job_id, "running")
                await asyncio.sleep(rng.uniform(0, 0.1))
            elif kind == 2:  # the moment the output is stored: racing PROJECT
                await reached(job_id, "executed")
            elif kind == 3:  # shortly after: racing PROJECT / COMPLETE
                await reached(job_id, "executed")
                await asyncio.sleep(rng.uniform(0, 0.05))
            elif kind == 4:  # late: usually too late
                await reached(job_id, "running")
                await asyncio.sleep(rng.uniform(0.5, 2.0))
            # kind 0: at once, most likely still queued
            try:
                res = await st.service.cancel(job_id, "u1", cancel_workflow=cancel_wf)
                outcomes[job_id] = res.outcome
            except JobNotCancellable:
                outcomes[job_id] = "too_late"
            return job_id

        t0 = time.monotonic()
        job_ids: list[uuid.UUID] = []
        for start in range(0, RACE_JOBS, RACE_BATCH):
            job_ids += await asyncio.gather(
                *(one(i) for i in range(start, min(start + RACE_BATCH, RACE_JOBS)))
            )
        final = await wait_jobs(db, job_ids, timeout=60)

        for job_id in job_ids:
            status, how = final[job_id], outcomes[job_id]
            assert status in ("succeeded", "cancelled"), (job_id, status, how)
            if how == "cancelled":  # the API cancelled it while queued
                assert status == "cancelled"
            if how == "too_late":  # the API found it finished
                assert status == "succeeded"

            f = await job_facts(db, job_id)
            row = await st.job(job_id)
            wid = st.workflow_id(job_id)
            if closed_unsent(await enqueue_row(db, job_id)):
                # Cancelled before a relay took it: its workflow was never started.
                assert how == "cancelled" and status == "cancelled", (job_id, how, status)
                assert await describe_or_none(temporal_client, wid) is None, (job_id, how)
                assert f.artifacts == [] and f.usage == [] and row.started_at is None
                assert f.events.get(CANCELLED) == 1 and COMPLETED not in f.events
                continue
            desc = await wait_workflow_closed(temporal_client, wid)
            assert desc.typed_search_attributes.get(LIFECYCLE_SA) == status, (job_id, how)
            if status == "succeeded":
                assert desc.status == WorkflowExecutionStatus.COMPLETED, (job_id, how)
                assert len(f.artifacts) == 1 and len(f.synthetic_results) == 1
                assert f.events.get(COMPLETED) == 1 and CANCELLED not in f.events
                assert row.progress == 100 and row.error_code is None
            else:
                assert desc.status in (
                    WorkflowExecutionStatus.CANCELED,  # cancelled while running
                    WorkflowExecutionStatus.COMPLETED,  # PREPARE found it cancelled
                ), (job_id, how, desc.status)
                assert f.artifacts == [] and f.synthetic_results == []
                assert COMPLETED not in f.events
                assert row.error_code == "CANCELLED"
            assert FAILED not in f.events

        mix = Counter((outcomes[j], final[j]) for j in job_ids)
        print(f"cancel race: {dict(mix)} in {time.monotonic() - t0:.1f}s")
        # The race was real: each side won sometimes.
        assert {s for _, s in mix} == {"succeeded", "cancelled"}, mix


async def test_a_non_cancellable_type_refuses_a_cancel_while_queued(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """`execution.cancellable = False` holds from creation: a queued job of such a type is not
    cancelled either (409 JOB_NOT_CANCELLABLE), and nothing about it changes."""
    pinned = variant(synthetic.JOB, "t_not_cancellable", cancellable=False)
    async with engine_stack(
        settings, temporal_client, queues=(), relay=False, extra_types=[pinned]
    ) as st:
        job_id = await st.create(job_type=pinned.job_type)
        with pytest.raises(JobNotCancellable) as refused:
            await st.service.cancel(job_id, "u1")
        assert refused.value.http_status == 409
        with pytest.raises(JobNotCancellable):
            await st.service.cancel(job_id, "admin", admin=True)
        row = await st.job(job_id)
        assert (row.lifecycle_status, row.cancel_requested_at) == ("queued", None)
        assert CANCELLED not in (await job_facts(db, job_id)).events
