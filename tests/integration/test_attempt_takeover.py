"""Two EXECUTE attempts of one job at once, through the real stage on the real PostgreSQL: the
later attempt takes the job over; the earlier one's lock check says no, its call is aborted and
charged as a failed call, and only the later attempt's answer becomes the job's output."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest
from sqlalchemy import text
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from activities.stages import JobActivities
from db.session import SessionMaker
from engine.contracts import ExecuteInput
from engine.settings import Settings
from runtime.wiring import engine_config, gateway
from tests.stack import Stack, engine_stack
from tests.support import eventually


def env_for(stack: Stack, job: uuid.UUID, attempt: int) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        workflow_id=stack.workflow_id(job),
        workflow_run_id="run-1",
        workflow_type="synthetic",
        attempt=attempt,
        heartbeat_timeout=None,
    )
    return env


async def test_a_taken_over_attempt_stores_nothing_and_its_call_is_charged(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        job = await st.create(input={"delayMs": 2500})
        cfg = dataclasses.replace(engine_config(settings), lock_extend_every_s=0.2)
        acts = JobActivities(db, st.parts.catalog, gateway(settings), cfg)
        inp = ExecuteInput(job_id=str(job), timeout_ms=30_000, abort_strategy="retry")
        first = asyncio.ensure_future(env_for(st, job, 1).run(acts.execute, inp))

        async def holder() -> str | None:
            async with db() as s:
                token = (
                    await s.execute(
                        text("SELECT locked_by FROM ai_job WHERE id = :id"), {"id": job}
                    )
                ).scalar_one()
            return str(token) if token and "/a1@" in token else None

        await eventually(holder, timeout=10, what="the first attempt to take the job")
        # Temporal gave up on the first attempt: the second takes the job over and answers.
        second = await env_for(st, job, 2).run(acts.execute, inp)
        assert second.output_hash
        with pytest.raises(Exception):  # noqa: B017  # its failure goes nowhere in Temporal
            await first
        async with db() as s:
            row = (
                await s.execute(
                    text("SELECT output_hash, locked_by, call_seq FROM ai_job WHERE id = :id"),
                    {"id": job},
                )
            ).one()
            usage = [
                tuple(r)
                for r in await s.execute(
                    text(
                        "SELECT attempt_no, call_no, error_code FROM ai_usage_log "
                        "WHERE job_id = :id ORDER BY attempt_no"
                    ),
                    {"id": job},
                )
            ]
    assert row.output_hash == second.output_hash and "/a2@" in row.locked_by
    # Each call is charged once, under its own number. The taken-over one is charged by the
    # attempt that took the job over, from the mark it left before sending (a lost worker's
    # call, at its worst case); its own later record, as aborted, writes nothing.
    assert usage == [(1, 1, "INTERNAL_WORKER_LOST"), (2, 2, None)], usage
    assert row.call_seq == 2
