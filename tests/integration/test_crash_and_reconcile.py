"""A worker process killed during EXECUTE, and the reconciler that makes SQL
right again when it and Temporal disagree (real PostgreSQL, real Temporal dev server)."""

from __future__ import annotations

import dataclasses
import os
import signal
import tempfile
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus

from activities.reconciler import Reconciler, ReconcilerConfig
from db.outbox import COMPLETED, FAILED
from db.session import SessionMaker
from runtime.wiring import reconciler_config
from tests.integration.engine_helpers import (
    describe_or_none,
    execute,
    job_facts,
    rows,
    scalar,
    start_worker,
    wait_activity_started,
    wait_workflow_closed,
    worker_processes,
)
from tests.stack import engine_stack, make_settings

# ---- worker crash --------------------------------------------------------------------------


async def test_worker_killed_during_execute_job_still_succeeds_once(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(database_url, temporal_address, AI_HEARTBEAT_TIMEOUT_MS=2000)
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": temporal_address,
        "TASK_QUEUE_SUFFIX": settings.task_queue_suffix,
        "AI_HEARTBEAT_TIMEOUT_MS": "2000",
        "AIJOBS_ENV": "test",
        "LOG_LEVEL": "WARNING",
    }
    logs = tempfile.TemporaryDirectory(prefix="aijobs-crash-")
    log = Path(logs.name) / "workers.log"
    # The relay runs here; the job's workers are the subprocesses.
    async with engine_stack(settings, temporal_client, queues=()) as st:
        with logs, worker_processes() as ps:
            ps.append(start_worker(env, log))
            job_id = await st.create(input={"delayMs": 4000, "echo": {"crash": True}})
            wid = st.workflow_id(job_id)
            await st.wait_status(job_id, "running", timeout=60)  # includes the worker's start-up
            await wait_activity_started(temporal_client, wid, "execute", timeout=30)
            assert ps[0].poll() is None, log.read_text()[-3000:]

            ps[0].kill()  # SIGKILL in the middle of the 4 s provider call
            assert ps[0].wait(timeout=10) == -signal.SIGKILL
            ps.append(start_worker(env, log))

            row = await st.wait_status(job_id, timeout=90)
            assert row.lifecycle_status == "succeeded", (
                row.error_code,
                row.internal_error_message,
                log.read_text()[-3000:],
            )
            assert row.attempt_count == 2
            desc = await wait_workflow_closed(temporal_client, wid)
            assert desc.status == WorkflowExecutionStatus.COMPLETED
            f = await job_facts(db, job_id)
            assert len(f.artifacts) == 1 and len(f.synthetic_results) == 1
            assert f.events.get(COMPLETED) == 1
            # The killed attempt never reached its write: the mark it committed before its call
            # was charged by the retry's take (a lost worker's call); the retry wrote its own.
            assert f.usage == [(1, "INTERNAL_WORKER_LOST"), (2, None)]
            assert row.locked_by.split("/")[1] == desc.run_id  # one run, locked once
            assert ps[1].poll() is None


# ---- reconciler ----------------------------------------------------------------------------


async def test_reconciler_fails_expired_lock_of_a_gone_workflow_only(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(database_url, temporal_address, AI_INTERACTIVE_CONCURRENCY=4)
    async with engine_stack(settings, temporal_client) as st:
        gone = await st.create(input={"hang": True})
        alive = await st.create(input={"hang": True})
        lost_cancel = await st.create(input={"hang": True})
        for j in (gone, alive, lost_cancel):
            await st.wait_status(j, "running")
            await wait_activity_started(temporal_client, st.workflow_id(j), "execute")

        # `gone`: its workflow is terminated from outside, so nothing will ever end the job.
        await temporal_client.get_workflow_handle(st.workflow_id(gone)).terminate("test")
        # All three look abandoned to SQL: their locks ran out long ago.
        await execute(
            db,
            "UPDATE ai_job SET lock_until = now() - interval '10 minutes' WHERE id = ANY(:ids)",
            ids=[gone, alive, lost_cancel],
        )
        # `lost_cancel`: a cancel was recorded but the Temporal cancel never arrived.
        await execute(
            db,
            "UPDATE ai_job SET cancel_requested_at = now() - interval '1 minute' WHERE id = :j",
            j=lost_cancel,
        )

        rec = Reconciler(db, temporal_client, no_relay(reconciler_config(settings)))
        result = await rec.run_once()

        assert result.expired_locks_failed == 1
        assert result.details[0] == f"failed {gone}"
        row = await st.job(gone)
        assert row.lifecycle_status == "failed"
        assert row.error_code == "INTERNAL_LOCK_EXPIRED"
        assert "lock expired" in (row.internal_error_message or "")
        assert row.public_error_message and "lock" not in row.public_error_message.lower()
        assert (await job_facts(db, gone)).events.get(FAILED) == 1

        # A job whose workflow still runs is left alone, however old its lock looks.
        row = await st.job(alive)
        assert row.lifecycle_status == "running" and row.error_code is None

        # The lost cancel was sent again, and the workflow ended the job.
        assert result.cancels_resent == 1
        row = await st.wait_status(lost_cancel, timeout=15)
        assert row.lifecycle_status == "cancelled"
        desc = await wait_workflow_closed(temporal_client, st.workflow_id(lost_cancel))
        assert desc.status == WorkflowExecutionStatus.CANCELED

        # A second pass finds nothing more to do.
        again = await rec.run_once()
        assert (again.expired_locks_failed, again.cancels_resent) == (0, 0)
        assert (await st.job(alive)).lifecycle_status == "running"

        await temporal_client.get_workflow_handle(st.workflow_id(alive)).terminate("test over")


async def test_reconciler_requeues_lost_enqueue_and_deletes_expired_snapshots(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(database_url, temporal_address)
    # No worker: workflows that get started stay open, which is all this test needs.
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        lost = await st.create()  # its enqueue will claim "published", but nothing started
        await execute(
            db,
            "UPDATE outbox_event SET status = 'published', attempt_count = 1, "
            "published_at = now() - interval '5 minutes' WHERE aggregate_id = :j",
            j=str(lost),
        )
        started = await st.create()  # really dispatched: its workflow exists
        assert await st.relay.run_once() == 1
        recent = await st.create()  # published a moment ago: too young to judge
        await execute(
            db,
            "UPDATE outbox_event SET status = 'published', attempt_count = 1, "
            "published_at = now() WHERE aggregate_id = :j",
            j=str(recent),
        )
        await execute(
            db,
            "UPDATE outbox_event SET published_at = now() - interval '5 minutes' "
            "WHERE aggregate_id = :j",
            j=str(started),
        )
        # Snapshots: one expired, the others not.
        await execute(
            db,
            "UPDATE ai_job_snapshot SET expires_at = now() - interval '1 second' WHERE job_id = :j",
            j=recent,
        )
        assert await describe_or_none(temporal_client, st.workflow_id(lost)) is None
        assert await describe_or_none(temporal_client, st.workflow_id(started)) is not None

        result = await Reconciler(
            db, temporal_client, no_relay(reconciler_config(settings))
        ).run_once()

        assert result.outbox_requeued == 1
        assert result.details == [f"requeued {lost}"]
        assert result.snapshots_deleted == 1
        status = {
            r.aggregate_id: (r.status, r.attempt_count, r.published_at)
            for r in await rows(
                db,
                "SELECT aggregate_id, status, attempt_count, published_at FROM outbox_event "
                "WHERE event_type = 'ai.job.enqueue'",
            )
        }
        assert status[str(lost)] == ("pending", 0, None)
        assert status[str(started)][0] == "published"
        assert status[str(recent)][0] == "published"
        snapshots = {r.job_id for r in await rows(db, "SELECT job_id FROM ai_job_snapshot")}
        assert snapshots == {lost, started}

        # The requeued enqueue goes out again: now its workflow exists.
        assert await st.relay.run_once() == 1
        assert await describe_or_none(temporal_client, st.workflow_id(lost)) is not None
        assert (
            await scalar(
                db,
                "SELECT status FROM outbox_event WHERE aggregate_id = :j",
                j=str(lost),
            )
            == "published"
        )

        for j in (lost, started):
            await temporal_client.get_workflow_handle(st.workflow_id(j)).terminate("test over")


def no_relay(cfg: ReconcilerConfig) -> ReconcilerConfig:
    """These tests run their relay in-process: the reconciler must not start the workflow one."""
    return dataclasses.replace(cfg, relay_shards=None)
