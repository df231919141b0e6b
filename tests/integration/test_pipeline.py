"""EXECUTE owns `running`: a job is running only while a worker slot calls the provider for it;
one paid call per attempt (a stored output is reused, heartbeats never wait on the database, a
cancel seen after the call is honoured); a SIGTERMed worker drains its call instead of throwing
the paid attempt away."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import signal
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from activities.stages import JobActivities
from db import attempts as attempts_db
from db.session import SessionMaker
from engine.contracts import ExecuteInput, FinalizeFailedInput, ProjectInput
from engine.settings import Settings
from runtime.wiring import engine_config, gateway
from tests.integration.engine_helpers import (
    job_facts,
    scripted_job_type,
    start_worker,
    wait_activity_started,
    worker_processes,
)
from tests.stack import Stack, engine_stack, make_settings
from tests.support import eventually


async def states(db: SessionMaker, ids: list[uuid.UUID]) -> list[tuple[str, int]]:
    async with db() as s:
        return [
            (r.lifecycle_status, r.progress)
            for r in await s.execute(
                text("SELECT lifecycle_status, progress FROM ai_job WHERE id = ANY(:ids)"),
                {"ids": ids},
            )
        ]


def env_for(
    stack: Stack, job: uuid.UUID, attempt: int = 1, workflow_id: str | None = None
) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        workflow_id=workflow_id or stack.workflow_id(job),
        workflow_type="synthetic",
        attempt=attempt,
        heartbeat_timeout=None,
    )
    return env


def execute_input(job: uuid.UUID, timeout_ms: int = 30_000) -> ExecuteInput:
    return ExecuteInput(job_id=str(job), timeout_ms=timeout_ms, abort_strategy="retry")


# ---- honest states ---------------------------------------------------------------------------


async def test_running_means_a_worker_slot_is_calling_the_provider(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """12 jobs, 2 provider slots: never more than 2 running in a slot (others running have left
    theirs, output stored, for PROJECT); the waiting ones read queued, progress 0;
    a waiting job is cancelled on the queued path and never calls the provider."""
    async with engine_stack(settings, temporal_client) as st:
        ids = [await st.create(input={"delayMs": 1500}) for _ in range(12)]
        most_running = 0
        waiting_cancelled: uuid.UUID | None = None
        snap: list[tuple[str, int]] = []

        async def observe() -> bool:
            """Checks the limits on every look; cancels one waiting job once the queue fills."""
            nonlocal most_running, waiting_cancelled, snap
            snap = await states(db, ids)
            running = [p for status, p in snap if status == "running"]
            queued = [p for status, p in snap if status == "queued"]
            # A job in a slot has no stored output yet (progress < 60); one at 60 has left its
            # slot and is in PROJECT/COMPLETE: running <= provider slots + jobs finishing.
            in_slot = [p for p in running if p < 60]
            most_running = max(most_running, len(in_slot))
            assert len(in_slot) <= 2, snap
            assert all(p == 0 for p in queued), snap
            if waiting_cancelled is None and len(running) == 2 and len(queued) >= 4:
                async with db() as s:
                    waiting_cancelled = (
                        await s.execute(
                            text(
                                "SELECT id FROM ai_job WHERE id = ANY(:ids) "
                                "AND lifecycle_status = 'queued' ORDER BY created_at DESC LIMIT 1"
                            ),
                            {"ids": ids},
                        )
                    ).scalar_one()
                result = await st.service.cancel(waiting_cancelled, "u1")
                assert result.outcome == "cancelled"  # the queued path: 200, not 202
            return sum(1 for status, _ in snap if status in ("succeeded", "cancelled")) == 12

        await eventually(
            observe, timeout=120, interval=0.1, what=lambda: f"all 12 jobs to end ({snap})"
        )
        assert most_running == 2
        assert waiting_cancelled is not None
        facts = await job_facts(db, waiting_cancelled)
        assert facts.usage == [] and facts.artifacts == []


# ---- one paid call per attempt ---------------------------------------------------------------


async def test_an_output_already_stored_is_reused_not_bought_again(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """An attempt stored its output but did not finish (its result was lost: Temporal retries
    it); the next attempt reuses the output. Once the job succeeded, another attempt ends
    without a call."""
    jt = scripted_job_type("stored_output")
    async with engine_stack(
        settings, temporal_client, queues=(), relay=False, extra_types=[jt]
    ) as st:
        job = await st.create(job_type=jt.job_type, input={"delayMs": 200})
        acts = JobActivities(db, st.parts.catalog, gateway(settings), engine_config(settings))
        wid = st.workflow_id(job, jt.job_type)
        first = await env_for(st, job, 1, wid).run(acts.execute, execute_input(job))
        assert first.output_hash and first.lifecycle_status is None  # stored, not projected
        second = await env_for(st, job, 2, wid).run(acts.execute, execute_input(job))
        assert (second.output_hash, second.lifecycle_status) == (first.output_hash, None)
        facts = await job_facts(db, job)
        assert facts.usage == [(1, None)]  # one provider call for two attempts
        # PROJECT (the workflow's next stage) finishes it; a late attempt then ends at once.
        await env_for(st, job, 1, wid).run(
            acts.project,
            ProjectInput(job_id=str(job), output_hash=first.output_hash),
        )
        third = await env_for(st, job, 3, wid).run(acts.execute, execute_input(job))
        assert third.lifecycle_status == "succeeded"
        assert (await job_facts(db, job)).usage == [(1, None)]


async def test_heartbeats_never_wait_on_the_database(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """The lock extension hangs (a slow database); heartbeats keep their own clock."""
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        job = await st.create(input={"delayMs": 2500})
        cfg = dataclasses.replace(engine_config(settings), lock_extend_every_s=0.2)
        acts = JobActivities(db, st.parts.catalog, gateway(settings), cfg)
        extensions = 0

        async def stuck_extend(*args: Any, **kwargs: Any) -> Any:
            nonlocal extensions
            extensions += 1
            await asyncio.Event().wait()  # never answers

        # The first transaction locks the job; only the extensions during the call hang.
        original = attempts_db.extend
        beats: list[float] = []
        env = env_for(st, job)
        env.on_heartbeat = lambda *a: beats.append(time.monotonic())

        async def run() -> Any:
            # A lock extension that hangs, patched in for this test only.
            setattr(attempts_db, "extend", stuck_extend)  # noqa: B010
            try:
                return await env.run(acts.execute, execute_input(job))
            finally:
                setattr(attempts_db, "extend", original)  # noqa: B010

        task = asyncio.ensure_future(run())
        await asyncio.sleep(2.0)
        setattr(attempts_db, "extend", original)  # noqa: B010  # the store needs it
        result = await task
        assert result.output_hash
        assert extensions >= 1
        # Heartbeats every ≤ 0.5 s throughout the call despite the hung extension.
        assert len(beats) >= 4
        gaps = [b - a for a, b in itertools.pairwise(beats)]
        assert max(gaps) < 1.0, gaps


async def test_a_cancel_seen_after_the_call_is_honoured_before_project(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """The cancel reached SQL only (its Temporal cancel was lost) while the provider worked:
    the paid call is recorded, nothing is projected, the job ends cancelled."""
    async with engine_stack(settings, temporal_client) as st:
        job = await st.create(input={"delayMs": 2500})
        await st.wait_status(job, "running")
        await wait_activity_started(temporal_client, st.workflow_id(job), "execute")
        async with db.begin() as s:
            await s.execute(
                text("UPDATE ai_job SET cancel_requested_at = now() WHERE id = :j"), {"j": job}
            )
        row = await st.wait_status(job, timeout=30)
        assert row.lifecycle_status == "cancelled"
        facts = await job_facts(db, job)
        assert facts.artifacts == [] and facts.synthetic_results == []
        assert facts.usage == [(1, None)]  # the call was paid for and is on the bill


async def test_a_failure_after_a_cancel_request_ends_cancelled(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """A cancel that meets a lost worker (heartbeat timeout) ends `cancelled`, not failed."""
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        job = await st.create()
        async with db.begin() as s:
            await s.execute(
                text(
                    "UPDATE ai_job SET lifecycle_status = 'running', status = 'processing', "
                    "locked_by = workflow_id || '/-/w', lock_until = now() + interval '1 minute', "
                    "cancel_requested_at = now() WHERE id = :j"
                ),
                {"j": job},
            )
        acts = JobActivities(db, st.parts.catalog, gateway(settings), engine_config(settings))
        fin = await env_for(st, job).run(
            acts.finalize_failed,
            FinalizeFailedInput(job_id=str(job), code="INTERNAL_WORKER_LOST"),
        )
        assert fin.lifecycle_status == "cancelled"
        assert (await st.job(job)).lifecycle_status == "cancelled"


async def test_a_job_that_never_started_running_fails_instead_of_staying_queued(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        job = await st.create()
        acts = JobActivities(db, st.parts.catalog, gateway(settings), engine_config(settings))
        fin = await env_for(st, job).run(
            acts.finalize_failed,
            FinalizeFailedInput(job_id=str(job), code="INTERNAL_SNAPSHOT_MISSING"),
        )
        assert fin.lifecycle_status == "failed"
        row = await st.job(job)
        assert (row.lifecycle_status, row.error_code) == ("failed", "INTERNAL_SNAPSHOT_MISSING")


# ---- drained deploys -------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_sigtermed_worker_finishes_its_call_and_the_attempt_counts_once(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(database_url, temporal_address)
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": temporal_address,
        "TASK_QUEUE_SUFFIX": settings.task_queue_suffix,
        "AIJOBS_ENV": "test",
        "LOG_LEVEL": "WARNING",
        "WORKER_DRAIN_S": "60",
    }
    logs = tempfile.TemporaryDirectory(prefix="aijobs-drain-")
    log = Path(logs.name) / "workers.log"
    async with engine_stack(settings, temporal_client, queues=()) as st:
        with logs, worker_processes() as ps:
            ps.append(start_worker(env, log))
            job = await st.create(input={"delayMs": 6000})
            wid = st.workflow_id(job)
            await st.wait_status(job, "running", timeout=60)
            await wait_activity_started(temporal_client, wid, "execute", timeout=30)
            ps[0].send_signal(signal.SIGTERM)  # a deploy, in the middle of the 6 s call
            ps.append(start_worker(env, log))  # the new version, to run what comes after
            row = await st.wait_status(job, timeout=90)
            assert row.lifecycle_status == "succeeded", (row.error_code, log.read_text()[-3000:])
            assert await asyncio.to_thread(ps[0].wait, 60) == 0  # drained, then exited cleanly
            assert row.attempt_count == 1
            facts = await job_facts(db, job)
            assert facts.usage == [(1, None)]
            assert len(facts.artifacts) == 1
