"""A deterministic fault in a bookkeeping stage ends the job `failed` with an INTERNAL_* code
within two minutes, its workflow closed (activities/bounded.py); the stack stays for
SUPER_ADMIN, the fault's text nowhere. A fault in the finalizer as well still closes the
workflow, and the reconciler ends the job once the fault is gone. Faults are real SQL errors
raised by PostgreSQL for one job only (a function or a trigger the test creates and drops)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from temporalio.client import Client, WorkflowExecutionStatus

from activities.reconciler import Reconciler
from db import stage_reads as stage_reads_db
from db.lifecycle import PREPARE_STATE
from db.session import SessionMaker
from engine.settings import Settings
from runtime.wiring import reconciler_config
from tests.integration.engine_helpers import execute, stage_names, wait_workflow_closed
from tests.stack import Stack, engine_stack, relay_running

pytestmark = pytest.mark.slow

FAULT = "injected-fault-text"
BOUND_S = 120.0


async def _fault_function(db: SessionMaker, job: uuid.UUID) -> None:
    """`aijobs_test_fault(id)`: raises (SQLSTATE P0001) for `job`, true for any other."""
    await execute(
        db,
        f"""
        CREATE OR REPLACE FUNCTION aijobs_test_fault(j uuid) RETURNS boolean
        LANGUAGE plpgsql AS $$
        BEGIN
            IF j = '{job}'::uuid THEN RAISE EXCEPTION '{FAULT}'; END IF;
            RETURN true;
        END $$
        """,
    )


@pytest.fixture
async def faults(db: SessionMaker) -> AsyncIterator[None]:
    yield
    for stmt in (
        "DROP TRIGGER IF EXISTS aijobs_test_fault ON synthetic_result",
        "DROP TRIGGER IF EXISTS aijobs_test_fault ON ai_job",
        "DROP FUNCTION IF EXISTS aijobs_test_fault_trigger()",
        "DROP FUNCTION IF EXISTS aijobs_test_fault(uuid)",
    ):
        await execute(db, stmt)


async def _trigger(db: SessionMaker, table: str, column: str, when: str) -> None:
    await execute(
        db,
        f"""
        CREATE OR REPLACE FUNCTION aijobs_test_fault_trigger() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM aijobs_test_fault(NEW.{column});
            RETURN NEW;
        END $$
        """,
    )
    await execute(
        db,
        f"CREATE TRIGGER aijobs_test_fault {when} ON {table} FOR EACH ROW "
        "EXECUTE FUNCTION aijobs_test_fault_trigger()",
    )


def _prepare_reads_through_the_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    """PREPARE's one read, asking the fault function about its row: PostgreSQL raises."""
    sql = str(PREPARE_STATE) + " AND aijobs_test_fault(id)"
    monkeypatch.setattr(stage_reads_db, "PREPARE_STATE", text(sql))


async def _stages(st: Stack, client: Client, job: uuid.UUID) -> tuple[list[str], object]:
    desc = await wait_workflow_closed(client, st.workflow_id(job), timeout=BOUND_S)
    history = await client.get_workflow_handle(st.workflow_id(job)).fetch_history()
    return stage_names(history), desc.status


def _assert_private(message: str | None, stage: str) -> None:
    assert message is not None
    assert f"{stage} failed: " in message, message
    assert "SQLSTATE P0001" in message, message
    assert "activities/" in message, message  # the engine's own frames
    assert FAULT not in message


async def test_a_deterministic_fault_in_prepare_ends_the_job_internal_error(
    db: SessionMaker,
    settings: Settings,
    temporal_client: Client,
    monkeypatch: pytest.MonkeyPatch,
    faults: None,
) -> None:
    async with engine_stack(settings, temporal_client, relay=False) as st:
        job = await st.create(input={"delayMs": 0})
        other = await st.create(input={"delayMs": 0})
        await _fault_function(db, job)
        _prepare_reads_through_the_fault(monkeypatch)
        began = time.monotonic()
        async with relay_running(st.relay):
            row = await st.wait_status(job, timeout=BOUND_S)
            assert (row.lifecycle_status, row.error_code) == ("failed", "INTERNAL_ERROR")
            assert time.monotonic() - began < BOUND_S
            assert FAULT not in (row.public_error_message or "")
            _assert_private(row.internal_error_message, "prepare")
            names, status = await _stages(st, temporal_client, job)
            assert names == ["prepare", "finalize_failed"]
            assert status == WorkflowExecutionStatus.FAILED
            # The other job is untouched by the fault.
            assert (await st.wait_status(other, timeout=60)).lifecycle_status == "succeeded"
        # Temporal's failure says the code and its public message, nothing of the fault.
        history = await temporal_client.get_workflow_handle(st.workflow_id(job)).fetch_history()
        assert FAULT not in str(history)


async def test_a_deterministic_fault_in_project_ends_the_job_internal(
    db: SessionMaker, settings: Settings, temporal_client: Client, faults: None
) -> None:
    async with engine_stack(settings, temporal_client, relay=False) as st:
        job = await st.create(input={"delayMs": 0})
        await _fault_function(db, job)
        await _trigger(db, "synthetic_result", "job_id", "BEFORE INSERT")
        began = time.monotonic()
        async with relay_running(st.relay):
            row = await st.wait_status(job, timeout=BOUND_S)
        assert row.lifecycle_status == "failed"
        assert row.error_code is not None and row.error_code.startswith("INTERNAL_")
        assert time.monotonic() - began < BOUND_S
        assert FAULT not in (row.internal_error_message or "")
        names, status = await _stages(st, temporal_client, job)
        assert names == ["prepare", "resolve", "execute", "project", "finalize_failed"]
        assert status == WorkflowExecutionStatus.FAILED
        async with db() as s:
            count = await s.scalar(
                text("SELECT count(*) FROM synthetic_result WHERE job_id = :j"), {"j": job}
            )
        assert count == 0


async def test_a_finalizer_that_fails_too_closes_the_workflow_and_the_reconciler_ends_it(
    db: SessionMaker,
    settings: Settings,
    temporal_client: Client,
    monkeypatch: pytest.MonkeyPatch,
    faults: None,
) -> None:
    async with engine_stack(settings, temporal_client, relay=False) as st:
        job = await st.create(input={"delayMs": 0})
        await _fault_function(db, job)
        _prepare_reads_through_the_fault(monkeypatch)
        # finalize_failed cannot write the job either (the relay's claim, which only marks the
        # job dispatched, still can: the fault is the stages', not the relay's).
        await _trigger(
            db,
            "ai_job",
            "id",
            "BEFORE UPDATE OF lifecycle_status, status, progress, error_code, finished_at",
        )
        async with relay_running(st.relay):
            names, status = await _stages(st, temporal_client, job)
        assert names == ["prepare", "finalize_failed"]
        assert status == WorkflowExecutionStatus.FAILED  # closed, not retried for ever
        assert (await st.job(job)).lifecycle_status == "queued"

        # The fault is repaired: the reconciler's waiting phase sends the enqueue again, and
        # the new run (PREPARE still faulting) ends the job through its finalizer.
        await execute(db, "DROP TRIGGER aijobs_test_fault ON ai_job")
        await execute(
            db,
            "UPDATE outbox_event SET published_at = now() - interval '5 minutes' "
            "WHERE aggregate_id = :j",
            j=str(job),
        )
        cfg = reconciler_config(settings)
        await Reconciler(db, temporal_client, cfg, catalog=st.parts.catalog).run_once()
        async with relay_running(st.relay):
            row = await st.wait_status(job, timeout=BOUND_S)
        assert (row.lifecycle_status, row.error_code) == ("failed", "INTERNAL_ERROR")
