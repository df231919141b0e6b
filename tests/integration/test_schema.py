"""The migrated schema is the models' schema, and its lifecycle guard trigger rejects every illegal
transition even from raw SQL: the migrations are the schema."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from db import lifecycle as lifecycle_db
from db.errors import LIFECYCLE_TRIGGER, is_lifecycle_violation, sqlstate
from db.lifecycle import NewJob
from db.migrate import schema_diff
from db.session import SessionMaker
from engine.lifecycle import LEGACY_STATUS, LifecycleStatus, is_legal

S = LifecycleStatus

# Raw single steps that reach each state from `queued` along legal edges.
PATH: dict[S, tuple[S, ...]] = {
    S.QUEUED: (),
    S.RUNNING: (S.RUNNING,),
    S.SUCCEEDED: (S.RUNNING, S.SUCCEEDED),
    S.FAILED: (S.RUNNING, S.FAILED),
    S.CANCELLED: (S.CANCELLED,),
}


def new_job(**kw: object) -> NewJob:
    job_id = uuid.uuid4()
    values: dict[str, Any] = {
        "id": job_id,
        "user_id": "u1",
        "job_type": "synthetic",
        "target_type": "test",
        "target_id": "t1",
        "idempotency_key": None,
        "request_fingerprint": "f" * 64,
        "queue_name": "ai-interactive",
        "priority": 50,
        "input": {},
        "credential_mode": "platform_key",
        "credential_id": None,
        "prompt_version": "v1",
        "input_schema_version": "synthetic.input.v1",
        "output_schema_version": "synthetic.output.v1",
        "max_retry_count": 1,
        "workflow_id": f"ai-interactive:synthetic:{job_id}",
    }
    values.update(kw)
    return NewJob(**values)


async def raw_set(sm: SessionMaker, job_id: uuid.UUID, to: S) -> None:
    async with sm.begin() as s:
        await s.execute(
            text("UPDATE ai_job SET lifecycle_status = :to, status = :legacy WHERE id = :id"),
            {"id": job_id, "to": str(to), "legacy": LEGACY_STATUS[to]},
        )


async def job_in(sm: SessionMaker, state: S) -> uuid.UUID:
    job = new_job()
    async with sm.begin() as s:
        await lifecycle_db.create(s, job)
    for step in PATH[state]:
        await raw_set(sm, job.id, step)
    return job.id


async def row_of(sm: SessionMaker, job_id: uuid.UUID) -> dict[str, object]:
    async with sm() as s:
        row = (await s.execute(text("SELECT * FROM ai_job WHERE id = :id"), {"id": job_id})).one()
    return dict(row._mapping)


# ---- schema ---------------------------------------------------------------------------------


def test_migrated_schema_matches_models(database_url: str) -> None:
    assert schema_diff(database_url) == []


async def test_lifecycle_guard_trigger_is_installed(db: SessionMaker) -> None:
    async with db() as s:
        row = (
            await s.execute(
                text(
                    """
                    SELECT t.tgenabled, p.proname, pg_get_triggerdef(t.oid) AS definition
                    FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
                    WHERE t.tgrelid = 'ai_job'::regclass AND t.tgname = 'ai_job_lifecycle_guard'
                      AND NOT t.tgisinternal
                    """
                )
            )
        ).one()
    assert row.tgenabled == "O"  # enabled ("origin")
    assert row.proname == "ai_job_lifecycle_guard"
    assert "BEFORE INSERT OR UPDATE OF lifecycle_status ON public.ai_job" in row.definition
    assert "FOR EACH ROW" in row.definition


# ---- the guard trigger ----------------------------------------------------------------------

PAIRS = [(a, b) for a, b in itertools.product(S, S) if a != b]


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
async def test_raw_update_obeys_the_transition_table(db: SessionMaker, src: S, dst: S) -> None:
    job_id = await job_in(db, src)
    before = await row_of(db, job_id)
    assert before["lifecycle_status"] == src
    if is_legal(src, dst):
        await raw_set(db, job_id, dst)
        assert (await row_of(db, job_id))["lifecycle_status"] == dst
        return
    with pytest.raises(DBAPIError) as info:
        await raw_set(db, job_id, dst)
    assert sqlstate(info.value) == LIFECYCLE_TRIGGER == "AJ001"
    assert is_lifecycle_violation(info.value)
    assert f"{src} -> {dst}" in str(info.value.orig)
    assert await row_of(db, job_id) == before


@pytest.mark.parametrize("state", [S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED])
async def test_insert_must_start_queued(db: SessionMaker, state: S) -> None:
    with pytest.raises(DBAPIError) as info:
        async with db.begin() as s:
            await lifecycle_db.create(s, new_job())
            await s.execute(
                text(
                    """
                    INSERT INTO ai_job (id, user_id, job_type, target_type, target_id,
                        request_fingerprint, lifecycle_status, status, queue_name, priority,
                        input, credential_mode, prompt_version, input_schema_version,
                        output_schema_version, max_retry_count, workflow_id)
                    VALUES (:id, 'u1', 'synthetic', 'test', 't1', 'f', :st, :legacy,
                        'ai-interactive', 50, '{}', 'platform_key', 'v1', 'i', 'o', 1, 'w')
                    """
                ),
                {"id": uuid.uuid4(), "st": str(state), "legacy": LEGACY_STATUS[state]},
            )
    assert sqlstate(info.value) == "AJ001"
    assert f"(new) -> {state}" in str(info.value.orig)
    async with db() as s:
        # The whole transaction rolled back, the legal insert before it included.
        assert (await s.execute(text("SELECT count(*) FROM ai_job"))).scalar_one() == 0


@pytest.mark.parametrize("state", list(S))
async def test_updates_that_keep_the_state_pass(db: SessionMaker, state: S) -> None:
    """The guard checks only lifecycle changes: a same-state write and other columns pass, even
    on terminal rows (progress, messages, cleanup)."""
    job_id = await job_in(db, state)
    async with db.begin() as s:
        await s.execute(
            text(
                "UPDATE ai_job SET lifecycle_status = lifecycle_status, progress = 42, "
                "internal_error_message = 'note' WHERE id = :id"
            ),
            {"id": job_id},
        )
    row = await row_of(db, job_id)
    assert (row["lifecycle_status"], row["progress"], row["internal_error_message"]) == (
        state,
        42,
        "note",
    )


async def test_trigger_checks_each_row_of_a_multi_row_update(db: SessionMaker) -> None:
    """One illegal row in a set-based UPDATE rejects the whole statement."""
    queued = await job_in(db, S.QUEUED)
    done = await job_in(db, S.SUCCEEDED)
    with pytest.raises(DBAPIError) as info:
        async with db.begin() as s:
            await s.execute(
                text("UPDATE ai_job SET lifecycle_status = 'cancelled' WHERE id = ANY(:ids)"),
                {"ids": [queued, done]},
            )
    assert sqlstate(info.value) == "AJ001"
    assert (await row_of(db, queued))["lifecycle_status"] == "queued"
    assert (await row_of(db, done))["lifecycle_status"] == "succeeded"
