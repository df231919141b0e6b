"""The claim's plan reads each waiting job and enqueue row a bounded number of times, whatever
the planner knows about the tables. A burst of creates into fresh (or truncated) tables, before
any ANALYZE, once made it join by nested loops that read the whole backlog for every row: at
800 waiting jobs of 64 users, about 590 buffers per job and 1.1 s per claim on never-analyzed
tables, 37 buffers per job on this test's tables with their statistics removed; the per-row
probes read about 13 either way. Counted in buffers, not timed."""

from __future__ import annotations

import json

from sqlalchemy import text

from db import relay as relay_db
from db.session import SessionMaker
from tests.integration.test_dispatch_window import create

JOBS = 800
USERS = 64


async def _claim_buffers(db: SessionMaker) -> tuple[int, int]:
    """(buffers the claim read, rows it claimed), in a transaction rolled back."""
    async with db() as s, s.begin():
        plan = (
            await s.execute(
                text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + relay_db.CLAIM.text),
                {"lim": 1000, "owner": "plan-test", "window": 4},
            )
        ).scalar_one()
        await s.rollback()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"]), int(top["Actual Rows"])


async def test_a_claim_over_a_backlog_with_no_statistics_reads_each_job_a_bounded_number_of_times(
    db: SessionMaker,
) -> None:
    for i in range(JOBS):
        await create(db, f"plan-u{i % USERS}")
    async with db.begin() as s:  # no statistics: the state of tables a burst lands on first
        await s.execute(
            text(
                "DELETE FROM pg_statistic WHERE starelid IN "
                "('ai_job'::regclass, 'outbox_event'::regclass)"
            )
        )
    buffers, claimed = await _claim_buffers(db)
    assert claimed == 4 * USERS  # each user's window
    assert buffers < 20 * JOBS, f"{buffers} buffers for {JOBS} waiting jobs"
