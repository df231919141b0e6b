"""The dispatch window's tests' shared steps (test_dispatch_window.py, test_by_design_waits.py,
test_claim_plan.py): a queued job and its enqueue row as a create writes them, one relay claim
marked published as the relay marks a batch that went out, and jobs that ran and succeeded."""

from __future__ import annotations

import uuid

from sqlalchemy import text

from db import lifecycle as lifecycle_db
from db import relay as relay_db
from db.lifecycle import NewJob
from db.outbox import ENQUEUE, enqueue_dedupe_key
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


def new_job(user: str, priority: int) -> NewJob:
    job_id = uuid.uuid4()
    return NewJob(
        id=job_id,
        user_id=user,
        job_type="synthetic",
        target_type="test",
        target_id="t1",
        idempotency_key=None,
        request_fingerprint="f" * 64,
        queue_name="ai-interactive",
        priority=priority,
        input={},
        credential_mode="platform_key",
        credential_id=None,
        prompt_version="v1",
        input_schema_version="synthetic.input.v1",
        output_schema_version="synthetic.output.v1",
        max_retry_count=1,
        workflow_id=f"ai-interactive:synthetic:{job_id}",
    )


async def create(db: SessionMaker, user: str, priority: int = 50) -> uuid.UUID:
    """A queued job and its enqueue row, as a create writes them."""
    job = new_job(user, priority)
    async with db.begin() as s:
        await lifecycle_db.create(s, job)
        await s.execute(
            text(
                "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, "
                "payload) VALUES (:ev, 'AiJob', :aid, :dk, CAST(:p AS jsonb))"
            ),
            {"ev": ENQUEUE, "aid": str(job.id), "dk": enqueue_dedupe_key(job.id), "p": "{}"},
        )
    return job.id
