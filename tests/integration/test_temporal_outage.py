"""Temporal away for a long while: jobs created before and during the outage all succeed once
it is back, with no manual step (no requeue, no restart of workers or relay).

The outage lasts AIJOBS_TEST_TEMPORAL_OUTAGE_S seconds (20 by default to keep the suite short;
run with 240 to see minutes pass). Workers, the relay workflow and the reconciler schedule run
as in production, on their own Temporal dev server with a database file (state survives the
restart) and their own PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
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
from runtime.worker import ensure_system_workflows
from tests.conftest import make_settings, running_stack

pytestmark = pytest.mark.slow

OUTAGE_S = float(os.environ.get("AIJOBS_TEST_TEMPORAL_OUTAGE_S", "20"))


async def test_jobs_created_before_and_during_a_temporal_outage_all_succeed() -> None:
    base = Path(tempfile.mkdtemp(prefix="aijobs-outage-"))
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
            RELAY_POLL_INTERVAL_S=0.2,
            RECONCILE_INTERVAL_S=2,
            OUTBOX_LOCK_TTL_S=10,
        )
        async with running_stack(
            settings, client, queues=("ai-interactive", "ai-system"), relay=False
        ) as stack:
            await ensure_system_workflows(client, settings)
            warm = await stack.create(input={"delayMs": 100})
            await stack.wait_status(warm, "succeeded", timeout=60)

            # Created while Temporal runs, but still waiting or running when it goes away.
            before = [await stack.create(input={"delayMs": 1500}) for _ in range(6)]
            await asyncio.to_thread(temporal.stop)
            went_down = time.monotonic()
            during: list[uuid.UUID] = []
            while time.monotonic() - went_down < OUTAGE_S:
                during.append(await stack.create(input={"delayMs": 100}))
                await asyncio.sleep(max(1.0, OUTAGE_S / 10))
            temporal = await asyncio.to_thread(
                start_temporal, port=port, ui_port=None, db_file=base / "temporal.db"
            )

            ids = [*before, *during]
            deadline = time.monotonic() + 180
            while True:
                async with stack.parts.sessionmaker() as s:
                    rows = dict(
                        (
                            await s.execute(
                                text(
                                    "SELECT lifecycle_status, count(*) FROM ai_job "
                                    "WHERE id = ANY(:ids) GROUP BY 1"
                                ),
                                {"ids": ids},
                            )
                        ).all()
                    )
                if rows.get("succeeded") == len(ids):
                    break
                assert time.monotonic() < deadline, f"not all jobs succeeded: {rows}"
                await asyncio.sleep(0.5)
            async with stack.parts.sessionmaker() as s:
                parked = (
                    await s.execute(
                        text("SELECT count(*) FROM outbox_event WHERE status IN ('dead','failed')")
                    )
                ).scalar_one()
            assert parked == 0
    finally:
        with contextlib.suppress(Exception):
            temporal.stop()
        with contextlib.suppress(Exception):
            pg.stop()
        shutil.rmtree(base, ignore_errors=True)
