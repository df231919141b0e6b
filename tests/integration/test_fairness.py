"""Fairness: one user's backlog does not make another user wait behind all of it. Jobs carry a
pseudonymous per-user fairness key (never the user id) that their EXECUTE inherits, and the
Temporal server dispatches waiting tasks fairly across keys within a priority."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from engine.settings import Settings
from runtime.wiring import create_policy
from tests.integration.engine_helpers import history_blobs, scalar
from tests.stack import engine_stack, make_settings
from tests.support import eventually


async def finish_order(db: SessionMaker, ids: list[uuid.UUID]) -> list[uuid.UUID]:
    async with db() as s:
        rows = await s.execute(
            text(
                "SELECT id FROM ai_job WHERE id = ANY(:ids) AND lifecycle_status = 'succeeded' "
                "ORDER BY finished_at, id"
            ),
            {"ids": ids},
        )
        return [r.id for r in rows]


async def test_a_second_user_is_not_starved_by_a_backlog(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(database_url, temporal_address, AI_INTERACTIVE_CONCURRENCY=1)
    async with engine_stack(settings, temporal_client) as st:
        a = [await st.create(user_id="tenant-a", input={"delayMs": 100}) for _ in range(40)]

        # Let A's backlog reach the task queue before B arrives.
        async def all_published() -> bool:
            published = await scalar(
                db,
                "SELECT count(*) FROM outbox_event WHERE status = 'published' "
                "AND aggregate_id = ANY(:ids)",
                ids=[str(x) for x in a],
            )
            return bool(published >= len(a))

        await eventually(all_published, timeout=30, what="A's backlog to be published")
        a_done_when_b_came = len(await finish_order(db, a))
        b = [await st.create(user_id="tenant-b", input={"delayMs": 100}) for _ in range(3)]
        for job in b:
            await st.wait_status(job, "succeeded", timeout=120)
        done = await finish_order(db, a + b)
        a_while_b_waited = sum(1 for x in done[: done.index(b[-1])] if x in a) - a_done_when_b_came
        # In arrival order B would wait for the rest of A's backlog (dozens of jobs); fair
        # dispatch alternates between the two users once B waits.
        print("A jobs run while B waited:", a_while_b_waited, "of", 40 - a_done_when_b_came)
        # Measured here: 5-7 with fairness, 25 of 39 with the keys removed. The bound leaves
        # room for a loaded machine and the task queue's partitions.
        assert a_while_b_waited <= 12, (a_while_b_waited, a_done_when_b_came)
        for job in a:
            await st.wait_status(job, "succeeded", timeout=120)


async def test_the_fairness_key_names_no_user(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    user = f"user-{uuid.uuid4().hex}"
    policy = create_policy(settings)
    key = policy.fairness_key(user)
    assert user not in key and key == policy.fairness_key(user) and len(key) <= 64
    assert key != policy.fairness_key(user + "x")
    async with engine_stack(settings, temporal_client) as st:
        job = await st.create(user_id=user)
        await st.wait_status(job, "succeeded")
        raw, _ = await history_blobs(temporal_client, st.workflow_id(job))
        assert key.encode() in raw  # the key is on the workflow (and inherited by EXECUTE)
        assert user.encode() not in raw
