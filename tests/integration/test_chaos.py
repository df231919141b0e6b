"""PostgreSQL and Temporal restarted under load (DESIGN §11 reliability): no job is lost, none
projects twice, none stays non-terminal once both are back.

This test owns its servers (a PostgreSQL data dir and a Temporal dev server with a database
file, so both keep their state across the restart) and does not disturb the session's.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text
from temporalio.client import Client

from db.migrate import upgrade
from runtime.embedded import free_port, start_postgres, start_temporal
from tests.conftest import Stack, make_settings, running_stack

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
    deadline = time.monotonic() + timeout_s
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        try:
            counts = await _counts(stack)
        except Exception:
            await asyncio.sleep(0.5)
            continue
        if sum(v for k, v in counts.items() if k in ("succeeded", "failed", "cancelled")) == total:
            return counts
        await asyncio.sleep(0.25)
    raise AssertionError(f"not all {total} jobs ended in {timeout_s}s: {counts}")


async def test_postgres_and_temporal_restarted_under_load() -> None:
    base = Path(tempfile.mkdtemp(prefix="aijobs-chaos-"))
    base.chmod(0o755)
    pg = start_postgres(base / "pg")
    port = free_port()
    temporal = start_temporal(port=port, ui_port=None, db_file=base / "temporal.db")
    try:
        upgrade(pg.uri)
        client = await Client.connect(temporal.address)
        settings = make_settings(
            pg.uri,
            temporal.address,
            AI_HEARTBEAT_TIMEOUT_MS=5000,
            OUTBOX_LOCK_TTL_S=5,
            RELAY_POLL_INTERVAL_S=0.2,
        )
        async with running_stack(settings, client, queues=("ai-interactive",)) as stack:
            ids = await _create_when_up(stack, JOBS_BEFORE)

            # Wait until work is in flight, then take PostgreSQL away for a moment.
            deadline = time.monotonic() + 60
            while (await _counts(stack)).get("succeeded", 0) < 3:
                assert time.monotonic() < deadline, "no job finished before the fault"
                await asyncio.sleep(0.1)
            await asyncio.to_thread(pg.stop)
            await asyncio.sleep(1.5)  # the outage itself (fault injection, not synchronisation)
            pg = await asyncio.to_thread(start_postgres, base / "pg")
            ids += await _create_when_up(stack, JOBS_DURING)

            # Then restart Temporal (same port, same database file) while jobs still run.
            await asyncio.to_thread(temporal.stop)
            temporal = await asyncio.to_thread(
                start_temporal, port=port, ui_port=None, db_file=base / "temporal.db"
            )

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
    finally:
        # Each stop on its own: a failing one must not leave the other server running.
        with contextlib.suppress(Exception):
            temporal.stop()
        with contextlib.suppress(Exception):
            pg.stop()
        shutil.rmtree(base, ignore_errors=True)
