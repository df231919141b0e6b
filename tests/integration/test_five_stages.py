"""A new job's history shows the engine's five stages under their own names, in order, as an
operator sees them in the Temporal UI: prepare, resolve, execute, project, complete; a failure
ends in finalize_failed and a cancel in finalize_cancelled; a job that cannot run (its key was
revoked: see test_credentials) stops at resolve, before it ever asks for a provider slot."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import Client

from activities import resolve as resolve_stage
from db import stage_reads
from db.session import SessionMaker
from db.stage_reads import ResolveRead
from engine.settings import Settings
from tests.integration.engine_helpers import (
    stage_names,
    wait_activity_started,
    wait_workflow_closed,
)
from tests.stack import Stack, engine_stack

pytestmark = pytest.mark.slow


async def stages_of(st: Stack, client: Client, job: uuid.UUID) -> list[str]:
    """Once the workflow has closed: a local activity's marker is written with the workflow
    task that follows it, after the stage's own commit that SQL already shows."""
    await wait_workflow_closed(client, st.workflow_id(job))
    history = await client.get_workflow_handle(st.workflow_id(job)).fetch_history()
    return stage_names(history)


async def test_a_succeeded_job_runs_the_five_stages_in_order(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client) as st:
        job = await st.create(input={"delayMs": 0})
        row = await st.wait_status(job)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert await stages_of(st, temporal_client, job) == [
            "prepare",
            "resolve",
            "execute",
            "project",
            "complete",
        ]
        assert row.progress == 100


async def test_a_job_whose_output_stays_invalid_fails_after_execute(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client) as st:
        job = await st.create(input={"invalidOutput": True})
        row = await st.wait_status(job, timeout=60)
        assert (row.lifecycle_status, row.error_code) == ("failed", "VALIDATION_OUTPUT_INVALID")
        # One `execute` in the list: its retries are attempts of the same activity.
        assert await stages_of(st, temporal_client, job) == [
            "prepare",
            "resolve",
            "execute",
            "finalize_failed",
        ]


async def test_a_job_cancelled_while_it_runs_ends_in_finalize_cancelled(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    # A short SQL lock: EXECUTE re-reads the job (and so sees the cancel) each time it extends
    # the lock, every half TTL; the queue's 60 s lock would make the test wait 30 s for it.
    async with engine_stack(settings, temporal_client, engine_overrides={"lock_ttl_s": 4}) as st:
        job = await st.create(input={"hang": True})
        await wait_activity_started(temporal_client, st.workflow_id(job))
        # Started in Temporal is not yet taken in SQL: EXECUTE's first transaction commits the
        # job `running` a moment later, and a cancel before it finds the job still queued.
        await st.wait_status(job, "running")
        result = await st.service.cancel(job, "u1")
        assert result.outcome == "cancel_requested"
        row = await st.wait_status(job, timeout=60)
        assert row.lifecycle_status == "cancelled"
        assert await stages_of(st, temporal_client, job) == [
            "prepare",
            "resolve",
            "execute",
            "finalize_cancelled",
        ]


async def test_resolve_takes_the_rows_prepare_read_for_it_instead_of_a_read_of_its_own(
    db: SessionMaker,
    settings: Settings,
    temporal_client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PREPARE's round trip reads RESOLVE's rows too and leaves them in the worker process
    (activities/stage_handoff.py): a plain job's RESOLVE opens no transaction."""
    own_reads: list[uuid.UUID] = []
    real = stage_reads.resolve_read

    async def counted(sm: SessionMaker, job_id: uuid.UUID) -> ResolveRead:
        own_reads.append(job_id)
        return await real(sm, job_id)

    monkeypatch.setattr(resolve_stage, "resolve_read", counted)
    async with engine_stack(settings, temporal_client) as st:
        job = await st.create(input={"delayMs": 0})
        row = await st.wait_status(job)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
    assert own_reads == []
