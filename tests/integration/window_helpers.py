"""The dispatch window's tests' shared steps (test_dispatch_window.py, test_by_design_waits.py):
one relay claim marked published as the relay marks a batch that went out, and jobs that ran
and succeeded."""

from __future__ import annotations

import uuid

from sqlalchemy import text

from db import relay as relay_db
from db.session import SessionMaker


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
