"""The webhook backlog as the API's `GET /metrics` reads it from PostgreSQL: the age of the
oldest due, undelivered delivery (rows backing off or in flight are not due), read through an
index, never by a scan of the deliveries' history; and the SQL behind the deliverer's claim and
the retention purge use their indexes too."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text

from api.metrics import ApiMetrics
from db.session import SessionMaker
from db.webhook_deliveries import OLDEST_DUE_SQL
from tests.integration.engine_helpers import execute, scalar
from tests.webhook_helpers import fanned_out


async def _backlog(db: SessionMaker) -> float:
    metrics = ApiMetrics(["synthetic"], CollectorRegistry())
    metrics.state.min_interval_s = 0.0
    await metrics.state.refresh(db)
    value = metrics.registry.get_sample_value("aijobs_webhook_backlog_oldest_age_seconds")
    assert value is not None
    return value


async def test_the_backlog_gauge_is_the_age_of_the_oldest_due_row(db: SessionMaker) -> None:
    assert await _backlog(db) == 0.0
    await fanned_out(db, "user-a", endpoints=1, jobs=3)
    ids = [1, 2, 3]
    assert await scalar(db, "SELECT count(*) FROM webhook_delivery WHERE id = ANY(:i)", i=ids) == 3
    # Due for two minutes (nobody delivered it), backing off, delivered long ago.
    await execute(
        db,
        "UPDATE webhook_delivery SET next_attempt_at = now() - interval '120 seconds' WHERE id = 1",
    )
    await execute(
        db,
        "UPDATE webhook_delivery SET status = 'failed', "
        "next_attempt_at = now() + interval '1 hour' WHERE id = 2",
    )
    await execute(
        db,
        "UPDATE webhook_delivery SET status = 'delivered', finished_at = now(), "
        "next_attempt_at = now() - interval '1 day' WHERE id = 3",
    )
    assert 119 <= await _backlog(db) < 180
    await execute(db, "UPDATE webhook_delivery SET status = 'dead' WHERE id = 1")
    assert await _backlog(db) == 0.0  # only a row backing off is left: nothing is due


@pytest.mark.parametrize(
    "sql",
    [
        OLDEST_DUE_SQL,
        # The claim's per-user probe and the purge's range.
        "SELECT id FROM webhook_delivery WHERE user_id = 'u' AND status IN ('pending', 'failed') "
        "AND next_attempt_at <= now() ORDER BY next_attempt_at, id LIMIT 16",
        "SELECT id FROM webhook_delivery WHERE status IN ('delivered', 'dead') "
        "AND finished_at < now() - interval '7 days' ORDER BY finished_at LIMIT 1000",
    ],
    ids=["backlog", "claim", "purge"],
)
async def test_webhook_reads_use_an_index(db: SessionMaker, sql: str) -> None:
    async with db.begin() as s:
        await s.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(r[0] for r in await s.execute(text(f"EXPLAIN {sql}")))
    assert "Seq Scan on webhook_delivery" not in plan, plan
    assert "Index" in plan, plan
