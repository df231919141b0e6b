"""The claim's plan reads each waiting job and enqueue row a bounded number of times, whatever
the planner knows about the tables. A burst of creates into fresh (or truncated) tables, before
any ANALYZE, once made it join by nested loops that read the whole backlog for every row: at
800 waiting jobs of 64 users, about 590 buffers per job and 1.1 s per claim on never-analyzed
tables. This test's tables are not quite that state (with their statistics removed, the old
joins read 37 buffers per job here), so it guards against a plan that reads the backlog per
row, not against the old statement as such; the per-row probes read about 13 buffers per
job. Counted in buffers, not timed."""

from __future__ import annotations

import json

from sqlalchemy import text

from db import relay as relay_db
from db.session import SessionMaker
from tests.integration.window_helpers import create

JOBS = 800
USERS = 64
# The two tables the claim reads and their indexes.
_RELATIONS = (
    "SELECT c.oid FROM pg_class c WHERE c.relname IN ('ai_job', 'outbox_event') "
    "UNION SELECT i.indexrelid FROM pg_index i "
    "WHERE i.indrelid IN ('ai_job'::regclass, 'outbox_event'::regclass)"
)


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
    # No statistics, as on tables never analyzed (the state a burst into fresh or truncated
    # tables lands on): no column statistics, sizes unknown (the planner then reads the files').
    async with db.begin() as s:
        await s.execute(text(f"DELETE FROM pg_statistic WHERE starelid IN ({_RELATIONS})"))
        await s.execute(
            text(f"UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE oid IN ({_RELATIONS})")
        )
    buffers, claimed = await _claim_buffers(db)
    assert claimed == 4 * USERS  # each user's window
    # A plan that reads the backlog once per row reads hundreds of buffers per job (590 at
    # 800 jobs); the probes read 13 to 43, by the statistics autovacuum may gather meanwhile.
    assert buffers < 60 * JOBS, f"{buffers} buffers for {JOBS} waiting jobs"
