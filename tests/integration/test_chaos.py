"""PostgreSQL and Temporal restarted under load: no job is lost, none
projects twice, none stays non-terminal once both are back; and EXECUTE waits out a database
that is down after its paid call instead of spending the attempt.

This test owns its servers (a PostgreSQL data dir and a Temporal dev server with a database
file, so both keep their state across the restart) and does not disturb the session's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid

import pytest
from sqlalchemy import text
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from activities.stages import JobActivities
from engine.contracts import ExecuteInput
from runtime.wiring import engine_config, gateway
from tests.integration.engine_helpers import job_facts
from tests.servers import own_servers
from tests.stack import INTERACTIVE, TERMINAL, Stack, engine_stack, make_settings
from tests.support import eventually

pytestmark = pytest.mark.slow

JOBS_BEFORE = 24
JOBS_DURING = 8


async def _create_when_up(stack: Stack, n: int, deadline_s: float = 60) -> list[uuid.UUID]:
    """Create n jobs, retrying each create while the database is still coming back."""
    ids: list[uuid.UUID] = []
    deadline = time.monotonic() + deadline_s
    while len(ids) < n:
        try:
            ids.append(await stack.create(input={"delayMs": 300}))
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    return ids


async def _counts(stack: Stack) -> dict[str, int]:
    async with stack.parts.sessionmaker() as s:
        rows = await s.execute(
            text("SELECT lifecycle_status, count(*) FROM ai_job GROUP BY lifecycle_status")
        )
        return {r[0]: int(r[1]) for r in rows}


async def _wait_all_terminal(stack: Stack, total: int, timeout_s: float) -> dict[str, int]:
    """Until all `total` jobs are terminal; the database may still be coming back."""
    counts: dict[str, int] = {}

    async def all_terminal() -> dict[str, int] | None:
        nonlocal counts
        try:
            counts = await _counts(stack)
        except Exception:
            return None
        return counts if sum(counts.get(s, 0) for s in TERMINAL) == total else None

    return await eventually(
        all_terminal,
        timeout=timeout_s,
        interval=0.25,
        what=lambda: f"all {total} jobs to end (counts: {counts})",
    )


async def test_postgres_and_temporal_restarted_under_load() -> None:
    with own_servers("aijobs-chaos-") as sv:
        client = await Client.connect(sv.temporal_address)
        settings = make_settings(
            sv.database_url,
            sv.temporal_address,
            AI_HEARTBEAT_TIMEOUT_MS=5000,
            RELAY_POLL_INTERVAL_S=0.2,
        )
        async with engine_stack(
            settings, client, queues=INTERACTIVE, relay_overrides={"lock_ttl_s": 5}
        ) as stack:
            ids = await _create_when_up(stack, JOBS_BEFORE)

            # Wait until work is in flight, then take PostgreSQL away for a moment.
            async def some_succeeded() -> bool:
                return (await _counts(stack)).get("succeeded", 0) >= 3

            await eventually(
                some_succeeded, timeout=60, interval=0.1, what="3 jobs to finish before the fault"
            )
            await asyncio.to_thread(sv.stop_postgres)
            await asyncio.sleep(1.5)  # the outage itself (fault injection, not synchronisation)
            await asyncio.to_thread(sv.start_postgres)
            ids += await _create_when_up(stack, JOBS_DURING)

            # Then restart Temporal (same port, same database file) while jobs still run.
            await asyncio.to_thread(sv.stop_temporal)
            await asyncio.to_thread(sv.start_temporal)

            counts = await _wait_all_terminal(stack, len(ids), timeout_s=150)
            assert counts == {"succeeded": len(ids)}, counts

            async with stack.parts.sessionmaker() as s:
                per_job = (
                    await s.execute(
                        text(
                            """
                            SELECT j.id,
                              (SELECT count(*) FROM synthetic_result r WHERE r.job_id = j.id),
                              (SELECT count(*) FROM ai_job_artifact a WHERE a.job_id = j.id),
                              (SELECT count(*) FROM outbox_event o
                               WHERE o.aggregate_id = j.id::text
                                 AND o.event_type = 'ai.job.completed')
                            FROM ai_job j
                            """
                        )
                    )
                ).all()
            assert len(per_job) == len(ids)
            for job_id, results, artifacts, completed in per_job:
                assert (results, artifacts, completed) == (1, 1, 1), job_id


async def test_execute_waits_out_postgres_down_after_the_call_without_spending_an_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """PostgreSQL goes away while the provider answers and stays away for several of EXECUTE's
    retries of its last transaction: the pooled connection is dead first, then no new one can be
    opened at all. The attempt waits for the database instead of failing, so the paid call is
    recorded once and the job succeeds on attempt 1."""
    with own_servers("aijobs-pgdown-") as sv:
        client = await Client.connect(sv.temporal_address)
        settings = make_settings(sv.database_url, sv.temporal_address)
        async with engine_stack(settings, client, queues=(), relay=False) as st:
            job = await st.create(input={"delayMs": 3000})
            acts = JobActivities(
                st.parts.sessionmaker, st.parts.catalog, gateway(settings), engine_config(settings)
            )
            env = ActivityEnvironment()
            env.info = dataclasses.replace(
                env.info,
                workflow_id=st.workflow_id(job),
                workflow_type="synthetic",
                attempt=1,
                heartbeat_timeout=None,
            )
            caplog.set_level(logging.WARNING, logger="activities.stages")
            task = asyncio.ensure_future(
                env.run(
                    acts.execute,
                    ExecuteInput(
                        job_id=str(job),
                        timeout_ms=30_000,
                        abort_strategy="retry",
                    ),
                )
            )
            await st.wait_status(job, "running")  # the provider is being called
            await asyncio.to_thread(sv.stop_postgres)

            def retries() -> int:
                return sum(
                    "database unavailable in EXECUTE" in r.getMessage() for r in caplog.records
                )

            async def retried_three_times_or_ended() -> bool:
                return retries() >= 3 or task.done()

            await eventually(
                retried_three_times_or_ended, timeout=30, interval=0.05, what="EXECUTE to retry"
            )
            assert not task.done(), task.exception()  # it did not give up on the database
            await asyncio.to_thread(sv.start_postgres)
            result = await asyncio.wait_for(task, 60)
            assert result.output_hash and result.attempt == 1
            facts = await job_facts(st.parts.sessionmaker, job)
            assert facts.usage == [(1, None)]  # one paid call, recorded once
            row = await st.job(job)
            assert row.attempt_count == 1 and row.lifecycle_status == "running"  # PROJECT is next
