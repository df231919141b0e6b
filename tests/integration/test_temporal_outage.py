"""Temporal away for a long while: jobs created before and during the outage all succeed once
it is back, with no manual step (no requeue, no restart of workers or relay).

The outage lasts AIJOBS_TEST_TEMPORAL_OUTAGE_S seconds (20 by default to keep the suite short;
run with 240 to see minutes pass). Workers, the relay and the reconciler schedule run
as in production, on their own Temporal dev server with a database file (state survives the
restart) and their own PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest
from sqlalchemy import text
from temporalio.client import Client

from engine.definition import SYSTEM_QUEUE
from runtime.worker import ensure_system_workflows
from tests.servers import own_servers
from tests.stack import INTERACTIVE, engine_stack, make_settings
from tests.support import eventually

pytestmark = pytest.mark.slow

OUTAGE_S = float(os.environ.get("AIJOBS_TEST_TEMPORAL_OUTAGE_S", "20"))


async def test_jobs_created_before_and_during_a_temporal_outage_all_succeed() -> None:
    with own_servers("aijobs-outage-") as sv:
        client = await Client.connect(sv.temporal_address)
        settings = make_settings(
            sv.database_url,
            sv.temporal_address,
            RELAY_POLL_INTERVAL_S=0.2,
            RECONCILE_INTERVAL_S=2,
        )
        # A relay loop beside the workers, and the ai-system worker's relay activity
        # (`ensure_system_workflows` starts its workflow), as in production; both release a
        # claim left by a relay attempt the outage cut short after 10 s.
        async with engine_stack(
            settings,
            client,
            queues=(*INTERACTIVE, SYSTEM_QUEUE),
            relay_overrides={"lock_ttl_s": 10},
        ) as stack:
            await ensure_system_workflows(client, settings)
            warm = await stack.create(input={"delayMs": 100})
            await stack.wait_status(warm, "succeeded", timeout=60)

            # Created while Temporal runs, but still waiting or running when it goes away.
            before = [await stack.create(input={"delayMs": 1500}) for _ in range(6)]
            await asyncio.to_thread(sv.stop_temporal)
            went_down = time.monotonic()
            during: list[uuid.UUID] = []
            while time.monotonic() - went_down < OUTAGE_S:
                during.append(await stack.create(input={"delayMs": 100}))
                await asyncio.sleep(max(1.0, OUTAGE_S / 10))
            await asyncio.to_thread(sv.start_temporal)

            ids = [*before, *during]
            counts: dict[str, int] = {}

            async def all_succeeded() -> bool:
                nonlocal counts
                async with stack.parts.sessionmaker() as s:
                    result = await s.execute(
                        text(
                            "SELECT lifecycle_status, count(*) FROM ai_job "
                            "WHERE id = ANY(:ids) GROUP BY 1"
                        ),
                        {"ids": ids},
                    )
                    counts = {status: int(n) for status, n in result.all()}
                return counts.get("succeeded") == len(ids)

            await eventually(
                all_succeeded,
                timeout=180,
                interval=0.5,
                what=lambda: f"all jobs to succeed (counts: {counts})",
            )
            async with stack.parts.sessionmaker() as s:
                parked = (
                    await s.execute(
                        text("SELECT count(*) FROM outbox_event WHERE status IN ('dead','failed')")
                    )
                ).scalar_one()
            assert parked == 0
