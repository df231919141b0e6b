"""The rollout guard (migration 0039) when two jobs of one arm end at once: the second guard
waits for the first one's transaction and counts its job, so an arm whose last jobs ended
together is judged on all of them. Before, each counted the arm's ended jobs without the other
(neither committed), and an arm of two failed jobs under `min_samples = 2` stayed active."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import text

from db.session import SessionMaker
from tests.integration.window_helpers import create
from tests.support import eventually

END = text(
    "UPDATE ai_job SET lifecycle_status = 'failed', status = 'failed', finished_at = now(), "
    "error_code = 'REQUEST_REJECTED' WHERE id = :id"
)


async def _rollout(db: SessionMaker, *jobs: uuid.UUID) -> uuid.UUID:
    """A rollout of the synthetic type (two arms, judged after 2 ended jobs, 90 % success),
    with `jobs` running in its canary arm."""
    rid = uuid.uuid4()
    async with db.begin() as s:
        await s.execute(
            text(
                "INSERT INTO ai_rollout (job_type, id, min_samples, min_mean_feedback, "
                "min_success_rate) VALUES ('synthetic', :r, 2, -1, 0.9)"
            ),
            {"r": rid},
        )
        await s.execute(
            text(
                "INSERT INTO ai_rollout_arm (rollout_id, name, position, weight) VALUES "
                "(:r, 'canary', 0, 50), (:r, 'stable', 1, 50)"
            ),
            {"r": rid},
        )
        await s.execute(
            text(
                "UPDATE ai_job SET rollout_id = :r, rollout_arm = 'canary', "
                "lifecycle_status = 'running', status = 'processing' WHERE id = ANY(:ids)"
            ),
            {"r": rid, "ids": list(jobs)},
        )
    return rid


async def _waits_on_a_lock(db: SessionMaker, pid: int) -> bool:
    async with db() as s:
        row = (
            await s.execute(
                text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            )
        ).first()
    return row is not None and row[0] == "Lock"


async def test_two_jobs_of_one_arm_ending_at_once_are_both_counted(db: SessionMaker) -> None:
    first, second = await create(db, "race-u1"), await create(db, "race-u2")
    rid = await _rollout(db, first, second)
    async with db() as a, db() as b:
        await a.execute(END, {"id": first})  # its guard holds the arms' locks, uncommitted
        pid = int((await b.execute(text("SELECT pg_backend_pid()"))).scalar_one())
        ending = asyncio.ensure_future(b.execute(END, {"id": second}))
        try:
            # The second guard waits for the first transaction before it counts.
            await eventually(lambda: _waits_on_a_lock(db, pid), timeout=10.0, interval=0.05)
        finally:
            await a.commit()
        await ending
        await b.commit()
    async with db() as s:
        state = (
            await s.execute(
                text(
                    "SELECT state, halted_reason FROM ai_rollout_arm "
                    "WHERE rollout_id = :r AND name = 'canary'"
                ),
                {"r": rid},
            )
        ).one()
    assert tuple(state) == ("halted", "success_rate")
