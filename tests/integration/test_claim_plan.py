"""The claim's plan reads each waiting job and enqueue row a bounded number of times, whatever
the planner knows about the tables. A burst of creates into fresh (or truncated) tables, before
any ANALYZE, once made it join by nested loops that read the whole backlog for every row: at
800 waiting jobs of 64 users, about 590 buffers per job and 1.1 s per claim on never-analyzed
tables. This test's tables are not quite that state (with their statistics removed, the old
joins read 37 buffers per job here), so it guards against a plan that reads the backlog per
row, not against the old statement as such; the per-row probes read about 13 buffers per
job. And a backlog being drained, claim after claim, as the relay drains a burst: each job's
enqueue row is found by its job, not by reading every pending row once per waiting job.
Counted in buffers, not timed."""

from __future__ import annotations

from sqlalchemy import text

from bench.claim_plan import explain_claim
from db.session import SessionMaker
from tests.integration.window_helpers import claimed, create, end

JOBS = 800
USERS = 64
# The two tables the claim reads and their indexes.
_RELATIONS = (
    "SELECT c.oid FROM pg_class c WHERE c.relname IN ('ai_job', 'outbox_event') "
    "UNION SELECT i.indexrelid FROM pg_index i "
    "WHERE i.indrelid IN ('ai_job'::regclass, 'outbox_event'::regclass)"
)


async def _forget_statistics(db: SessionMaker) -> None:
    """No statistics, as on tables never analyzed (the state a burst into fresh or truncated
    tables lands on): no column statistics, sizes unknown (the planner then reads the files')."""
    async with db.begin() as s:
        await s.execute(text(f"DELETE FROM pg_statistic WHERE starelid IN ({_RELATIONS})"))
        await s.execute(
            text(f"UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE oid IN ({_RELATIONS})")
        )


async def test_a_claim_over_a_backlog_with_no_statistics_reads_each_job_a_bounded_number_of_times(
    db: SessionMaker,
) -> None:
    for i in range(JOBS):
        await create(db, f"plan-u{i % USERS}")
    await _forget_statistics(db)
    buffers, rows, _ = await explain_claim(db, 1000)
    assert rows == 4 * USERS  # each user's window
    # A plan that reads the backlog once per row reads hundreds of buffers per job (590 at
    # 800 jobs); the probes read 13 to 43, by the statistics autovacuum may gather meanwhile.
    assert buffers < 60 * JOBS, f"{buffers} buffers for {JOBS} waiting jobs"


async def test_a_claim_while_a_backlog_drains_finds_each_enqueue_row_by_its_job(
    db: SessionMaker,
) -> None:
    jobs = 500
    for i in range(jobs):
        await create(db, f"drain-u{i % USERS}")
    await _forget_statistics(db)
    for _ in range(14):  # the relay's claims of 16 as the jobs before them end
        ids = await claimed(db, window=4, limit=16)
        assert len(ids) == 16
        await end(db, *ids)
    buffers, rows, indexes = await explain_claim(db, 16)
    assert rows == 16
    # Each waiting job's enqueue row by its job, each claimed row by its id: about 2,000 buffers
    # for this claim. Through the index of every pending row, filtered by job or id, the backlog
    # was read once per waiting job: about 30,000 (bench/claim_plan.py --drain, on a fresh
    # database; this one's statistics do not lead the planner there on their own, so the plan's
    # indexes are checked as well).
    assert buffers < 10 * jobs, f"{buffers} buffers for a claim of 16 over {jobs} waiting jobs"
    assert "ix_outbox_event_pending_enqueue" in indexes, indexes
    assert "ix_outbox_event_dispatchable" not in indexes, indexes
