"""Every way a job ends leaves exactly one matching domain event in the outbox, written by the
transaction that ended it (jobs/lifecycle.py writes both): success, a failure after running, a
failure of a job that never ran, a cancel while queued and while running, a cancel that wins
over a failure, the reconciler's abandoned job and a bulk cancel. Real PostgreSQL and Temporal.

"The same transaction" is read from the rows: `finished_at` and the event's `created_at` are
both `now()`, PostgreSQL's transaction start time, so they are equal only when one transaction
wrote both."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from temporalio.client import Client

from activities.reconciler import Reconciler
from db import lifecycle as lifecycle_db
from db import outbox as outbox_db
from db.jobs import JobFilter
from db.session import SessionMaker
from engine.errors import IllegalTransition
from engine.lifecycle import LifecycleStatus
from engine.settings import Settings
from jobs import lifecycle
from jobs.bulk import BulkPolicy, BulkService
from runtime.wiring import reconciler_config
from tests.integration.engine_helpers import (
    execute,
    rows,
    wait_activity_started,
    workflow_canceller,
)
from tests.stack import engine_stack

pytestmark = pytest.mark.slow


@dataclasses.dataclass(frozen=True)
class Ending:
    status: str
    error_code: str | None
    output_hash: str | None
    events: list[tuple[str, dict[str, Any]]]  # the job's domain events, in id order
    same_transaction: list[bool]  # per event: written by the transaction that ended the job


async def ending(db: SessionMaker, job_id: uuid.UUID) -> Ending:
    (job,) = await rows(
        db,
        "SELECT lifecycle_status, error_code, output_hash, finished_at FROM ai_job WHERE id = :j",
        j=job_id,
    )
    events = await rows(
        db,
        "SELECT event_type, payload, created_at FROM outbox_event "
        "WHERE aggregate_id = :j AND event_type = ANY(:ev) ORDER BY id",
        j=str(job_id),
        ev=list(outbox_db.JOB_EVENTS),
    )
    return Ending(
        status=job.lifecycle_status,
        error_code=job.error_code,
        output_hash=job.output_hash,
        events=[(e.event_type, e.payload) for e in events],
        same_transaction=[e.created_at == job.finished_at for e in events],
    )


def failed(job_id: uuid.UUID, code: str) -> list[tuple[str, dict[str, Any]]]:
    return [(outbox_db.FAILED, {"jobId": str(job_id), "jobType": "synthetic", "errorCode": code})]


def cancelled(job_id: uuid.UUID) -> list[tuple[str, dict[str, Any]]]:
    return [(outbox_db.CANCELLED, {"jobId": str(job_id)})]


async def test_every_ending_writes_its_one_event_in_its_own_transaction(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    # Phase 1, no worker and no relay: what ends (or is set up) while jobs can only be queued.
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        queued_cancel = await st.create(input={"delayMs": 0})
        assert (await st.service.cancel(queued_cancel, "u1")).outcome == "cancelled"

        bulk_jobs = [await st.create("bulk-user", input={"delayMs": 0}) for _ in range(2)]
        bulk = BulkService(st.parts.sessionmaker, st.service, BulkPolicy())
        op = (
            await bulk.submit("root", "cancel", JobFilter(user_id="bulk-user"), {"userId": "x"})
        ).operation
        items = await bulk.pending_page(op.id, after=0, limit=10)
        assert [await bulk.act(op.id, "cancel", item) for item in items] == ["done", "done"]

        # Its input expires before it is dispatched: RESOLVE fails it before any slot, and
        # finalize_failed takes it from queued through running to failed.
        never_ran = await st.create(input={"delayMs": 0})
        await execute(
            db,
            "UPDATE ai_job_snapshot SET expires_at = now() - interval '1 second' WHERE job_id = :j",
            j=never_ran,
        )

    # Phase 2, workers and the relay: the workflow's endings, and the reconciler's.
    async with engine_stack(settings, temporal_client) as st:
        ok = await st.create(input={"delayMs": 0})
        rejected = await st.create(input={"failTimes": 1, "failCode": "REQUEST_REJECTED"})
        hung = await st.create(input={"hang": True})
        abandoned = await st.create(input={"hang": True})
        for j in (hung, abandoned):
            await st.wait_status(j, "running")
            await wait_activity_started(temporal_client, st.workflow_id(j), "execute")

        result = await st.service.cancel(
            hung, "u1", cancel_workflow=workflow_canceller(temporal_client)
        )
        assert result.outcome == "cancel_requested"

        # Nothing will ever end `abandoned` but the reconciler: its workflow is gone and its
        # lock ran out long ago.
        await temporal_client.get_workflow_handle(st.workflow_id(abandoned)).terminate("test")
        await execute(
            db,
            "UPDATE ai_job SET lock_until = now() - interval '10 minutes' WHERE id = :j",
            j=abandoned,
        )
        config = reconciler_config(settings)
        rec = await Reconciler(db, temporal_client, config).run_once()
        assert rec.expired_locks_failed == 1

        for j in (ok, rejected, hung, never_ran):
            await st.wait_status(j, timeout=60)

    endings = {
        name: await ending(db, j)
        for name, j in {
            "ok": ok,
            "rejected": rejected,
            "never_ran": never_ran,
            "queued_cancel": queued_cancel,
            "running_cancel": hung,
            "abandoned": abandoned,
            "bulk_0": bulk_jobs[0],
            "bulk_1": bulk_jobs[1],
        }.items()
    }
    assert endings["ok"].status == "succeeded"
    assert endings["ok"].events == [
        (
            outbox_db.COMPLETED,
            {
                "jobId": str(ok),
                "jobType": "synthetic",
                "outputHash": endings["ok"].output_hash,
                "artifactCount": 1,
            },
        )
    ]
    assert (endings["rejected"].status, endings["rejected"].events) == (
        "failed",
        failed(rejected, "REQUEST_REJECTED"),
    )
    assert (endings["never_ran"].status, endings["never_ran"].events) == (
        "failed",
        failed(never_ran, "SNAPSHOT_EXPIRED"),
    )
    assert (endings["abandoned"].status, endings["abandoned"].events) == (
        "failed",
        failed(abandoned, "INTERNAL_LOCK_EXPIRED"),
    )
    for name, j in (
        ("queued_cancel", queued_cancel),
        ("running_cancel", hung),
        ("bulk_0", bulk_jobs[0]),
        ("bulk_1", bulk_jobs[1]),
    ):
        assert (endings[name].status, endings[name].events) == ("cancelled", cancelled(j)), name
    # Each event was written by the transaction that ended its job.
    assert {name: e.same_transaction for name, e in endings.items()} == {
        name: [True] for name in endings
    }


async def test_finalize_failed_after_a_cancel_request_ends_cancelled_with_its_event(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    # A worker lost while the job was being cancelled: the failure that follows the request
    # ends the job `cancelled`, with the cancel's event and no failure event.
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        queued = await st.create(input={"delayMs": 0})
        running = await st.create(input={"delayMs": 0})
    async with db.begin() as s:
        await lifecycle_db.lock(s, running, owner="wf-running", identity="test", ttl_s=60)
    for j in (queued, running):
        await execute(db, "UPDATE ai_job SET cancel_requested_at = now() WHERE id = :j", j=j)
        async with db.begin() as s:
            end = await lifecycle.finalize_failed(
                s, j, code="INTERNAL_WORKER_LOST", owner="wf", identity="test"
            )
        assert end == lifecycle.Ending(LifecycleStatus.CANCELLED, "CANCELLED", "synthetic")
        got = await ending(db, j)
        assert (got.status, got.events, got.same_transaction) == (
            "cancelled",
            cancelled(j),
            [True],
        )

    # An ending that loses the race (the job already ended) writes no second event.
    async with db.begin() as s:
        with pytest.raises(IllegalTransition):
            await lifecycle.cancel(s, queued)
    async with db.begin() as s:
        with pytest.raises(IllegalTransition):
            await lifecycle.fail(s, running, job_type="synthetic", code="INTERNAL_ERROR")
    assert (await ending(db, queued)).events == cancelled(queued)
    assert (await ending(db, running)).events == cancelled(running)
