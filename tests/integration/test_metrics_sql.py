"""The API's scrape-time reads never scan a whole table: each has an index that serves it.

With sequential scans priced out, PostgreSQL must find an index path for every read; a table
this small would otherwise be scanned whatever the indexes, which would prove nothing. A read
that loses its index (a dropped partial index, a changed predicate) fails here."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from db.metrics import ACTIVE_JOBS_SQL, OLDEST_PENDING_SQL, OUTBOX_SQL, RECENT_JOBS_SQL
from db.session import SessionMaker


@pytest.mark.parametrize(
    ("sql", "table"),
    [
        (ACTIVE_JOBS_SQL, "ai_job"),
        (RECENT_JOBS_SQL, "ai_job"),
        (OUTBOX_SQL, "outbox_event"),
        (OLDEST_PENDING_SQL, "outbox_event"),
    ],
    ids=["active-jobs", "recent-jobs", "outbox", "oldest-pending"],
)
async def test_state_reads_use_an_index(db: SessionMaker, sql: str, table: str) -> None:
    async with db.begin() as s:
        await s.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(r[0] for r in await s.execute(text(f"EXPLAIN {sql}"), {"w": 3600.0}))
    assert f"Seq Scan on {table}" not in plan, plan
    assert "Index" in plan, plan
