"""No job is stranded: each way a job used to stay `queued` or `running` forever, reproduced and
repaired (outbox dedupe, parked enqueues, closed workflows, Temporal Reset)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import subprocess
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.reconciler import Reconciler
from db import outbox as outbox_db
from db.outbox import enqueue_dedupe_key
from db.session import SessionMaker
from engine.settings import Settings
from jobs.service import CreateJobRequest, EnqueueNotWritten
from runtime.embedded import temporal_binary
from runtime.wiring import reconciler_config
from tests.integration.engine_helpers import execute
from tests.stack import engine_stack, new_relay, relay_running
from tests.support import eventually

pytestmark = pytest.mark.slow


def reconciler(
    stack_settings: Settings, sm: SessionMaker, client: Client, **kw: object
) -> Reconciler:
    values: dict[str, Any] = {
        "missing_workflow_after_s": 0,
        "revive_base_s": 0,
        **kw,
    }
    cfg = dataclasses.replace(reconciler_config(stack_settings), **values)
    return Reconciler(sm, client, cfg)


async def outbox_status(sm: SessionMaker, job_id: uuid.UUID) -> str:
    async with sm() as s:
        return str(
            (
                await s.execute(
                    text(
                        "SELECT status FROM outbox_event WHERE aggregate_id = :j "
                        "AND event_type = 'ai.job.enqueue'"
                    ),
                    {"j": str(job_id)},
                )
            ).scalar_one()
        )


# ---- the enqueue can never be suppressed ----------------------------------------------------


async def test_an_idempotency_key_equal_to_another_jobs_id_still_runs(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client) as st:
        a = await st.create()
        b = await st.create(idempotency_key=str(a))
        assert a != b
        for job in (a, b):
            assert (await st.wait_status(job, "succeeded")).lifecycle_status == "succeeded"


async def test_user_ids_with_colons_do_not_collide(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client) as st:
        # Under a "{type}:{user}:{key}" key these two spelled the same string.
        a = await st.create(user_id="acme:1", idempotency_key="x")
        b = await st.create(user_id="acme", idempotency_key="1:x")
        await st.wait_status(a, "succeeded")
        await st.wait_status(b, "succeeded")


async def test_a_create_whose_enqueue_row_is_not_written_rolls_back(
    db: SessionMaker, settings: Settings, temporal_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    forced = uuid.uuid4()
    async with engine_stack(settings, temporal_client, relay=False) as st:
        async with db.begin() as s:
            await outbox_db.insert(
                s,
                event_type="ai.job.enqueue",
                aggregate_type="AiJob",
                aggregate_id="squatter",
                dedupe_key=enqueue_dedupe_key(forced),
                payload={},
                notify=False,
            )
        monkeypatch.setattr("jobs.creation.uuid.uuid4", lambda: forced)
        with pytest.raises(EnqueueNotWritten):
            await st.service.create(
                CreateJobRequest(
                    user_id="u1", job_type="synthetic", target_type="t", target_id="1", input={}
                )
            )
        assert await st.job(forced) is None  # nothing committed: no job waits without an enqueue


# ---- parked and malformed enqueues ------------------------------------------------------------


async def test_a_parked_enqueue_of_a_waiting_job_is_revived_and_the_job_runs(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, relay=False) as st:
        job = await st.create()
        await execute(
            db,
            "UPDATE outbox_event SET status = 'dead', attempt_count = 3, "
            "last_error = 'start failed' WHERE aggregate_id = :j",
            j=str(job),
        )
        result = await reconciler(st.settings, db, temporal_client).run_once()
        assert result.enqueues_revived == 1
        assert await outbox_status(db, job) == "pending"
        async with relay_running(new_relay(st)):
            await st.wait_status(job, "succeeded")


async def test_revival_backs_off_per_revival(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, relay=False) as st:
        job = await st.create()
        await execute(
            db,
            "UPDATE outbox_event SET status = 'dead', revive_count = 3, "
            "available_at = now() - interval '100 seconds' WHERE aggregate_id = :j",
            j=str(job),
        )
        rec = reconciler(st.settings, db, temporal_client, revive_base_s=30.0)
        # Fourth revival: 30 s * 2^3 = 240 s after parking; only 100 s have passed.
        assert (await rec.run_once()).enqueues_revived == 0
        await execute(
            db,
            "UPDATE outbox_event SET available_at = now() - interval '241 seconds' "
            "WHERE aggregate_id = :j",
            j=str(job),
        )
        assert (await rec.run_once()).enqueues_revived == 1


async def test_a_malformed_payload_fails_only_its_own_row(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, relay=False) as st:
        jobs = [await st.create() for _ in range(3)]
        async with db.begin() as s:
            bad = await outbox_db.insert(
                s,
                event_type="ai.job.enqueue",
                aggregate_type="AiJob",
                aggregate_id="not-a-job",
                dedupe_key="ai.job.enqueue:not-a-job",
                payload={"jobId": "not-a-uuid"},
                notify=False,
            )
        relay = new_relay(st)
        assert await relay.run_once() == 4
        for job in jobs:
            assert await outbox_status(db, job) == "published"
        async with db() as s:
            status = (
                await s.execute(text("SELECT status FROM outbox_event WHERE id = :i"), {"i": bad})
            ).scalar_one()
        assert status == "failed"
        for job in jobs:
            await st.wait_status(job, "succeeded")


# ---- closed workflows and expired locks ------------------------------------------------------


async def test_a_queued_job_whose_workflow_was_terminated_gets_a_fresh_run(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    # No job worker yet: the workflow starts and waits for its first task.
    async with engine_stack(settings, temporal_client, queues=()) as st:
        job = await st.create()
        await eventually(
            lambda: _published(db, job), timeout=30, what="the enqueue to be published"
        )
        handle = temporal_client.get_workflow_handle(st.workflow_id(job))
        await handle.terminate(reason="operator mistake")
        assert (await st.job(job)).lifecycle_status == "queued"
        result = await reconciler(st.settings, db, temporal_client).run_once()
        assert result.outbox_requeued == 1
    async with engine_stack(settings, temporal_client) as st2:
        row = await st2.wait_status(job, "succeeded", timeout=60)
        assert row.lifecycle_status == "succeeded"
        runs = [
            w async for w in temporal_client.list_workflows(f"WorkflowId = '{row.workflow_id}'")
        ]
        assert len(runs) == 2  # the terminated run and the fresh one


async def _published(db: SessionMaker, job: uuid.UUID) -> bool:
    return await outbox_status(db, job) == "published"


async def test_the_reconciler_pages_through_every_expired_lock(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """More orphans than one page: every one is failed in a single pass (a page of 20 here,
    so 50 orphans span three of them; the production page is 200)."""
    n, page = 50, 20
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        ids = [await st.create() for _ in range(n)]
        async with db.begin() as s:
            await s.execute(
                text(
                    "UPDATE ai_job SET lifecycle_status = 'running', status = 'processing', "
                    "locked_by = workflow_id || '/-/gone', started_at = now(), "
                    "lock_until = now() - interval '1 hour' WHERE id = ANY(:ids)"
                ),
                {"ids": ids},
            )
        result = await reconciler(st.settings, db, temporal_client, page=page).run_once()
        assert result.expired_locks_failed == n
        async with db() as s:
            left = (
                await s.execute(
                    text("SELECT count(*) FROM ai_job WHERE lifecycle_status = 'running'")
                )
            ).scalar_one()
        assert left == 0


# ---- Temporal Reset ------------------------------------------------------------------------------


async def test_a_reset_workflow_keeps_its_lock_and_the_job_succeeds(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client) as st:
        job = await st.create(input={"delayMs": 2500})
        row = await st.wait_status(job, "running")
        await eventually(
            lambda: _has_activity_started(temporal_client, row.workflow_id),
            timeout=30,
            what="EXECUTE to start",
        )
        await asyncio.to_thread(
            subprocess.run,
            [
                temporal_binary(),
                "workflow",
                "reset",
                "--address",
                temporal_client.service_client.config.target_host,
                "--workflow-id",
                row.workflow_id,
                "--type",
                "FirstWorkflowTask",
                "--reason",
                "test: operator reset",
                "--yes",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        done = await st.wait_status(job, "succeeded", "failed", timeout=60)
        assert (done.lifecycle_status, done.error_code) == ("succeeded", None)
        async with db() as s:
            artifacts = (
                await s.execute(
                    text("SELECT count(*) FROM ai_job_artifact WHERE job_id = :j"), {"j": job}
                )
            ).scalar_one()
        assert artifacts == 1


async def _has_activity_started(client: Client, workflow_id: str) -> bool:
    desc = await client.get_workflow_handle(workflow_id).describe()
    return any(p.activity_type.name == "execute" for p in desc.raw_description.pending_activities)


# ---- a workflow whose task keeps failing ---------------------------------------------------


@workflow.defn(name="synthetic")
class BrokenDeploySynthetic:
    """A bad deploy of the job's workflow: a plain exception fails the workflow task, which
    Temporal retries forever while the job sits in SQL."""

    @workflow.run
    async def run(self, inp: Any) -> None:
        raise RuntimeError("simulated non-determinism after a deploy")


async def test_a_workflow_whose_task_keeps_failing_is_reported(
    db: SessionMaker, settings: Settings, temporal_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        job = await st.create()
        await execute(
            db,
            "UPDATE outbox_event SET status = 'published', published_at = now() "
            "WHERE aggregate_id = :j",
            j=str(job),
        )
        queue = f"broken-{uuid.uuid4().hex[:10]}"
        async with Worker(
            temporal_client,
            task_queue=queue,
            workflows=[BrokenDeploySynthetic],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            handle = await temporal_client.start_workflow(
                "synthetic", {"jobId": str(job)}, id=st.workflow_id(job), task_queue=queue
            )
            try:

                async def failing_attempts() -> int:
                    desc = await handle.describe()
                    return desc.raw_description.pending_workflow_task.attempt

                await eventually(
                    lambda: _at_least(failing_attempts, 4), timeout=30, what="task retries"
                )
                with caplog.at_level(logging.ERROR, logger="activities.reconciler"):
                    result = await reconciler(st.settings, db, temporal_client).run_once()
                assert result.stuck_workflows == 1
                assert result.outbox_requeued == 0  # a running workflow is not replaced
                assert any(
                    getattr(r, "alert", None) == "AIJOBS_STUCK_WORKFLOW" for r in caplog.records
                )
            finally:
                await handle.terminate(reason="test over")
        assert (await st.job(job)).lifecycle_status == "queued"


async def _at_least(probe: Callable[[], Awaitable[int]], n: int) -> bool:
    return await probe() >= n
