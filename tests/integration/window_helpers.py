"""The dispatch window's tests' shared steps (test_dispatch_window.py, test_by_design_waits.py,
test_claim_plan.py, test_queue_stats.py): a queued job and its enqueue row as a create writes
them, one relay claim marked published as the relay marks a batch that went out, and jobs that
ran and succeeded (what the claim's plan reads: `bench/claim_plan.py` `explain_claim`)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime

from sqlalchemy import text

from db import lifecycle as lifecycle_db
from db import relay as relay_db
from db.outbox import ENQUEUE, enqueue_dedupe_key
from db.session import SessionMaker
from tests.integration.engine_helpers import new_job


async def claimed(db: SessionMaker, window: int, limit: int = 100) -> list[uuid.UUID]:
    """What one claim takes, marked published as the relay marks a batch that went out."""
    rows = await relay_db.claim(db, owner="relay-t", limit=limit, window=window)
    async with db.begin() as s:
        await s.execute(
            text("UPDATE outbox_event SET status = 'published' WHERE id = ANY(:ids)"),
            {"ids": [r.id for r in rows]},
        )
    return [uuid.UUID(r.aggregate_id) for r in rows]


async def end(db: SessionMaker, *ids: uuid.UUID) -> None:
    """The jobs ran and succeeded."""
    async with db.begin() as s:
        for step, legacy in (("running", "processing"), ("succeeded", "completed")):
            await s.execute(
                text(
                    "UPDATE ai_job SET lifecycle_status = :to, status = :legacy "
                    "WHERE id = ANY(:ids)"
                ),
                {"ids": list(ids), "to": step, "legacy": legacy},
            )


async def create(
    db: SessionMaker, user: str, priority: int = 50, *, due: datetime | None = None
) -> uuid.UUID:
    """A queued job and its enqueue row, as a create writes them (`due`: a delayed job's,
    due then and its row available then)."""
    job = dataclasses.replace(new_job(user), priority=priority, run_at=due, due_at=due)
    async with db.begin() as s:
        await lifecycle_db.create(s, job)
        await s.execute(
            text(
                "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, "
                "payload, available_at) VALUES (:ev, 'AiJob', :aid, :dk, CAST(:p AS jsonb), "
                "coalesce(CAST(:at AS timestamptz), now()))"
            ),
            {
                "ev": ENQUEUE,
                "aid": str(job.id),
                "dk": enqueue_dedupe_key(job.id),
                "p": "{}",
                "at": due,
            },
        )
    return job.id
