"""The relay's wake-ups on the real PostgreSQL and Temporal dev server: a create that commits while
a claim is in flight (after the claim's snapshot, so the claim cannot see its row) is claimed
right after it, not at the next poll. The race is made certain: the claim's round trip is
wrapped so a second job is created, and its NOTIFY heard, before the claim's result is read.
And a slow claim asks for the queue tables' statistics to be refreshed."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client

from activities.relay_stats import QueueStats
from db import relay as relay_db
from db.session import SessionMaker
from engine.settings import Settings
from tests.stack import INTERACTIVE, engine_stack, new_relay, relay_running
from tests.support import eventually

# Far beyond the test's wait: only a kept wake-up can start the second job in time.
POLL_S = 600.0


async def test_a_create_committed_during_a_claim_is_claimed_next_not_at_the_poll(
    db: SessionMaker,
    settings: Settings,
    temporal_client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with engine_stack(settings, temporal_client, queues=INTERACTIVE, relay=False) as st:
        relay = new_relay(st, poll_interval_s=POLL_S)
        real_claim = relay_db.claim_batch
        late: list[uuid.UUID] = []

        async def claim_then_a_create(*args: Any, **kwargs: Any) -> Any:
            got = await real_claim(*args, **kwargs)
            if not late:  # the first claim: a create commits before its result is read
                heard = relay.wake.heard[0]
                late.append(await st.create(target_id="late"))

                async def notify_heard() -> bool:
                    return relay.wake.heard[0] > heard

                await eventually(notify_heard, timeout=10, what="the late create's NOTIFY")
            return got

        monkeypatch.setattr(relay_db, "claim_batch", claim_then_a_create)
        async with relay_running(relay):
            first = await st.create(target_id="first")
            assert (await st.wait_status(first, timeout=30)).lifecycle_status == "succeeded"
            assert late, "the first claim ran"
            t0 = time.monotonic()
            row = await st.wait_status(late[0], timeout=30)
            assert row.lifecycle_status == "succeeded"
            assert time.monotonic() - t0 < POLL_S / 10


async def test_a_slow_claim_refreshes_the_queue_statistics(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, queues=INTERACTIVE, relay=False) as st:
        relay = new_relay(st)
        relay.stats = QueueStats(st.parts.sessionmaker, slow_s=0.0, min_changes=1)
        job = await st.create()

        async def counted() -> bool:  # each backend reports its changes within about a second
            async with st.parts.sessionmaker() as s:
                n = await s.execute(
                    text(
                        "SELECT min(n_mod_since_analyze) FROM pg_stat_user_tables "
                        "WHERE relname IN ('ai_job', 'outbox_event')"
                    )
                )
                return int(n.scalar() or 0) >= 1

        await eventually(counted, timeout=10, what="the create's changes counted")
        assert await relay.run_once() == 1  # every claim is slow at slow_s=0
        await relay.stats.wait()
        assert sorted(relay.stats.analyzed) == ["ai_job", "outbox_event"]
        assert (await st.wait_status(job, timeout=30)).lifecycle_status == "succeeded"
