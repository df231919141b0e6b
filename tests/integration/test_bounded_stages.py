"""A deterministic fault in a bookkeeping stage ends the job `failed` with an INTERNAL_* code
within two minutes, its workflow closed (activities/bounded.py); the stack stays for
SUPER_ADMIN, the fault's text nowhere. A fault in the finalizer as well still closes the
workflow, and the reconciler ends the job itself once the fault is gone, never starting it
again. Faults are real SQL errors raised by PostgreSQL for one job only (a function or a
trigger the test creates and drops)."""

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
from tests.integration.engine_helpers import (
    execute,
    insert_job,
    rows,
    scalar,
    stage_names,
    wait_workflow_closed,
)
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


async def test_a_statement_timeout_or_a_lock_not_available_is_not_waited_out(
    db: SessionMaker,
    settings: Settings,
    temporal_client: Client,
    monkeypatch: pytest.MonkeyPatch,
    faults: None,
) -> None:
    """PREPARE's read stopped on every try by a statement timeout (57014) for one job, by a
    lock not available (55P03) for another: the driver's OperationalError of an outage, but
    the database answered. Each counts toward the bound: the job ends INTERNAL_ERROR."""
    async with engine_stack(settings, temporal_client, relay=False) as st:
        timed_out = await st.create(input={"delayMs": 0})
        locked = await st.create(input={"delayMs": 0})
        await execute(
            db,
            f"""
            CREATE OR REPLACE FUNCTION aijobs_test_fault(j uuid) RETURNS boolean
            LANGUAGE plpgsql AS $$
            BEGIN
                IF j = '{timed_out}'::uuid THEN
                    RAISE EXCEPTION '{FAULT}' USING ERRCODE = '57014';
                END IF;
                IF j = '{locked}'::uuid THEN
                    RAISE EXCEPTION '{FAULT}' USING ERRCODE = '55P03';
                END IF;
                RETURN true;
            END $$
            """,
        )
        _prepare_reads_through_the_fault(monkeypatch)
        async with relay_running(st.relay):
            for job, state in ((timed_out, "57014"), (locked, "55P03")):
                row = await st.wait_status(job, timeout=BOUND_S)
                assert (row.lifecycle_status, row.error_code) == ("failed", "INTERNAL_ERROR")
                assert f"SQLSTATE {state}" in (row.internal_error_message or "")
                names, _ = await _stages(st, temporal_client, job)
                assert names == ["prepare", "finalize_failed"]


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
    """The finalizer gives up after its attempts and its workflow closes failed. The reconciler
    never starts it again (a new run would meet the same fault, pass after pass): while the
    fault holds, its passes leave the job as it is; once the fault is gone, its next pass ends
    the job itself, by CAS, as the finalizer was ending it: `failed`, `INTERNAL_ERROR`."""
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
        handle = temporal_client.get_workflow_handle(st.workflow_id(job))
        first_run = (await handle.describe()).run_id

        # Past the waiting phase's delay: the job is a candidate of every pass.
        await execute(
            db,
            "UPDATE outbox_event SET published_at = now() - interval '5 minutes' "
            "WHERE aggregate_id = :j",
            j=str(job),
        )
        cfg = reconciler_config(settings)
        reconciler = Reconciler(db, temporal_client, cfg, catalog=st.parts.catalog)
        for _ in range(3):  # the fault holds: nothing is started again, nothing changes
            result = await reconciler.run_once()
            assert (result.outbox_requeued, result.finalizers_ended) == (0, 0), result
        assert (await st.job(job)).lifecycle_status == "queued"
        pending = (
            "SELECT count(*) FROM outbox_event WHERE aggregate_id = :j AND status <> 'published'"
        )
        assert await scalar(db, pending, j=str(job)) == 0

        await execute(db, "DROP TRIGGER aijobs_test_fault ON ai_job")
        result = await reconciler.run_once()
        assert (result.outbox_requeued, result.finalizers_ended) == (0, 1), result
        row = await st.job(job)
        assert (row.lifecycle_status, row.error_code) == ("failed", "INTERNAL_ERROR")
        assert (await handle.describe()).run_id == first_run  # one run in all
        assert (await reconciler.run_once()).finalizers_ended == 0  # ended once


@pytest.mark.parametrize(
    ("finalizer", "cancel_requested", "ending"),
    [
        ("finalize_failed", False, ("failed", "INTERNAL_ERROR")),
        ("finalize_failed", True, ("cancelled", "CANCELLED")),
        ("finalize_cancelled", False, ("cancelled", "CANCELLED")),
    ],
)
async def test_the_reconciler_writes_the_ending_the_finalizer_was_writing(
    db: SessionMaker,
    temporal_client: Client,
    finalizer: str,
    cancel_requested: bool,
    ending: tuple[str, str],
) -> None:
    """By CAS, through jobs/lifecycle.py: a cancel the user asked for still wins; a queued job
    is taken and failed in one transaction; a second ending is a no-op."""
    from activities.metrics import worker_metrics
    from activities.reconciler_endings import ReconcilerEndings

    job = await insert_job(db)
    if cancel_requested:
        await execute(db, "UPDATE ai_job SET cancel_requested_at = now() WHERE id = :j", j=job)
    endings = ReconcilerEndings(db, temporal_client, worker_metrics())
    wf = f"ai-interactive:synthetic:{job}"
    assert await endings.end(job, wf, finalizer) == ending[0]
    row = (await rows(db, "SELECT lifecycle_status, error_code FROM ai_job WHERE id = :j", j=job))[
        0
    ]
    assert (row.lifecycle_status, row.error_code or "CANCELLED") == ending
    events = (
        "SELECT count(*) FROM outbox_event "
        "WHERE aggregate_id = :j AND event_type <> 'ai.job.enqueue'"
    )
    assert await scalar(db, events, j=str(job)) == 1
    assert await endings.end(job, wf, finalizer) is None  # ended once
    assert await scalar(db, events, j=str(job)) == 1
