"""The engine on the real PostgreSQL and Temporal dev server: the synthetic path end to end, the
retry rules of each error code (docs/api.md, "Errors") and the projection stage's exactly-once
effects."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.stages import JobActivities
from db.outbox import COMPLETED, FAILED
from db.pipeline import Statement
from db.session import SessionMaker
from engine.contracts import JobWorkflowResult, ProjectInput, ProjectResult
from engine.errors import public_message_for
from engine.hashing import output_hash
from engine.settings import Settings
from jobs.spec import Artifact, Planner, Projection, ProjectionContext
from jobs.types import synthetic
from runtime.wiring import engine_config, gateway
from tests.integration.engine_helpers import (
    JOB_ID_SA,
    JOB_TYPE_SA,
    LIFECYCLE_SA,
    insert_artifacts,
    job_facts,
    project_in,
    rows,
    scalar,
    scripted_job_type,
    wait_workflow_closed,
)
from tests.stack import Stack, engine_stack
from tests.support import eventually

# Text that must never reach a public error message.
INTERNAL_MARKERS = ("synthetic failure", "Traceback", "attempt", "/", "Error(", "{")


async def finished(
    stack: Stack, job_id: uuid.UUID, job_type: str = "synthetic"
) -> tuple[Any, WorkflowExecutionDescription]:
    """The job's terminal row and its closed workflow's description (SQL first, then Temporal:
    once the workflow is closed no further attempt can add rows)."""
    await stack.wait_status(job_id, timeout=45)
    desc = await wait_workflow_closed(stack.client, stack.workflow_id(job_id, job_type))
    return await stack.job(job_id), desc


def assert_public_message_clean(row: Any, code: str) -> None:
    msg = row.public_error_message
    assert msg == public_message_for(code)
    for marker in INTERNAL_MARKERS:
        assert marker not in msg, (marker, msg)


# ---- end to end ----------------------------------------------------------------------------


async def test_synthetic_job_end_to_end(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client) as st:
        job_id = await st.create(input={"echo": {"n": 7, "s": "x"}})
        row, desc = await finished(st, job_id)

        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.status == "completed"
        assert row.progress == 100
        assert row.attempt_count == 1
        assert row.error_code is None and row.public_error_message is None
        assert row.output == {"ok": True, "echo": {"n": 7, "s": "x"}}
        assert row.output_hash == output_hash(row.output)
        assert row.started_at is not None and row.finished_at is not None

        f = await job_facts(db, job_id)
        assert len(f.artifacts) == 1 and f.artifacts[0][0] == "synthetic_result"
        assert f.synthetic_results == [(f.artifacts[0][1], row.output_hash)]
        assert f.usage == [(1, None)]
        assert f.events == {"ai.job.enqueue": 1, COMPLETED: 1}
        (completed,) = await rows(
            db,
            "SELECT payload FROM outbox_event WHERE event_type = :t AND aggregate_id = :j",
            t=COMPLETED,
            j=str(job_id),
        )
        assert completed.payload == {
            "jobId": str(job_id),
            "jobType": "synthetic",
            "outputHash": row.output_hash,
            "artifactCount": 1,
        }

        wid = st.workflow_id(job_id)
        assert row.workflow_id == wid
        assert desc.status == WorkflowExecutionStatus.COMPLETED
        result = await temporal_client.get_workflow_handle(
            wid, result_type=JobWorkflowResult
        ).result()
        assert result == JobWorkflowResult(str(job_id), "succeeded", output_hash=row.output_hash)
        sa = desc.typed_search_attributes
        assert sa.get(JOB_ID_SA) == str(job_id)
        assert sa.get(JOB_TYPE_SA) == "synthetic"
        assert sa.get(LIFECYCLE_SA) == "succeeded"

        async def listed() -> list[WorkflowExecution] | None:
            found = [w async for w in temporal_client.list_workflows(f"JobId = '{job_id}'")]
            ok = [w for w in found if w.typed_search_attributes.get(LIFECYCLE_SA) == "succeeded"]
            return found if ok else None

        found = await eventually(listed, timeout=15, what="the job in visibility")
        assert [w.id for w in found] == [wid]
        assert found[0].status == WorkflowExecutionStatus.COMPLETED
        assert found[0].workflow_type == "synthetic"


# ---- retries -------------------------------------------------------------------------------

INTERNAL_3 = scripted_job_type("t_internal_3", max_retries=3, backoff_ms=1000)
TIMEOUT_FAIL = scripted_job_type(
    "t_timeout_fail", timeout_ms=1000, max_retries=2, backoff_ms=1000, abort_strategy="fail"
)
TIMEOUT_RETRY = scripted_job_type(
    "t_timeout_retry", timeout_ms=1000, max_retries=2, backoff_ms=1000, abort_strategy="retry"
)
RETRY_TYPES = (INTERNAL_3, TIMEOUT_FAIL, TIMEOUT_RETRY)


async def test_transient_failure_is_retried_then_succeeds(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client) as st:
        job_id = await st.create(input={"failTimes": 1})
        row, desc = await finished(st, job_id)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.attempt_count == 2
        assert desc.status == WorkflowExecutionStatus.COMPLETED
        f = await job_facts(db, job_id)
        assert f.usage == [(1, "PROVIDER_UNAVAILABLE"), (2, None)]
        assert len(f.artifacts) == 1 and f.events[COMPLETED] == 1


@pytest.mark.parametrize("code", ["CONTENT_SAFETY_BLOCKED", "CREDENTIAL_INVALID"])
async def test_non_retryable_code_fails_at_once(
    code: str, db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client) as st:
        job_id = await st.create(input={"failTimes": 1, "failCode": code})
        row, desc = await finished(st, job_id)
        assert row.lifecycle_status == "failed"
        assert row.status == "failed"
        assert row.error_code == code
        assert row.attempt_count == 1
        assert_public_message_clean(row, code)
        # The detail is kept for operators, not shown to users.
        assert "synthetic failure on attempt 1" in (row.internal_error_message or "")
        f = await job_facts(db, job_id)
        assert f.usage == [(1, code)]
        assert f.artifacts == [] and f.synthetic_results == []
        assert f.events.get(FAILED) == 1 and COMPLETED not in f.events
        assert desc.status == WorkflowExecutionStatus.FAILED
        assert desc.typed_search_attributes.get(LIFECYCLE_SA) == "failed"
        with pytest.raises(WorkflowFailureError) as exc_info:
            await temporal_client.get_workflow_handle(st.workflow_id(job_id)).result()
        cause = exc_info.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == code


async def test_retries_exhausted_end_failed_with_last_code(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client) as st:
        job_id = await st.create(input={"failTimes": 5})
        row, desc = await finished(st, job_id)
        assert row.lifecycle_status == "failed"
        assert row.error_code == "PROVIDER_UNAVAILABLE"
        assert row.attempt_count == synthetic.DEFINITION.max_attempts == 2
        assert_public_message_clean(row, "PROVIDER_UNAVAILABLE")
        f = await job_facts(db, job_id)
        assert f.usage == [(1, "PROVIDER_UNAVAILABLE"), (2, "PROVIDER_UNAVAILABLE")]
        assert f.artifacts == [] and COMPLETED not in f.events
        assert desc.status == WorkflowExecutionStatus.FAILED


async def test_internal_error_is_retried_exactly_once(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """INTERNAL_* is retried once even though the definition allows 4 attempts."""
    assert INTERNAL_3.definition.max_attempts == 4
    async with engine_stack(settings, temporal_client, extra_types=RETRY_TYPES) as st:
        job_id = await st.create(
            job_type="t_internal_3", input={"failTimes": 10, "failCode": "INTERNAL_ERROR"}
        )
        row, _ = await finished(st, job_id, "t_internal_3")
        assert row.lifecycle_status == "failed"
        assert row.error_code == "INTERNAL_ERROR"
        assert_public_message_clean(row, "INTERNAL_ERROR")
        f = await job_facts(db, job_id)
        assert f.usage == [(1, "INTERNAL_ERROR"), (2, "INTERNAL_ERROR")]


async def test_invalid_output_is_validation_error_and_retried(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client) as st:
        job_id = await st.create(input={"invalidOutput": True})
        row, _ = await finished(st, job_id)
        assert row.lifecycle_status == "failed"
        assert row.error_code == "VALIDATION_OUTPUT_INVALID"
        assert_public_message_clean(row, "VALIDATION_OUTPUT_INVALID")
        assert (row.internal_error_message or "").startswith("VALIDATION_OUTPUT_INVALID: ")
        assert row.output is None and row.output_hash is None
        f = await job_facts(db, job_id)
        assert f.usage == [(1, "VALIDATION_OUTPUT_INVALID"), (2, "VALIDATION_OUTPUT_INVALID")]
        assert f.artifacts == []


async def test_timeout_follows_abort_strategy(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """timeoutMs 1000 on a 3 s call (or a hang): `fail` stops after one attempt, `retry` uses
    all three the definition allows."""
    async with engine_stack(settings, temporal_client, extra_types=RETRY_TYPES) as st:
        fail_id = await st.create(job_type="t_timeout_fail", input={"delayMs": 3000})
        retry_id = await st.create(job_type="t_timeout_retry", input={"hang": True})
        fail_row, fail_desc = await finished(st, fail_id, "t_timeout_fail")
        retry_row, retry_desc = await finished(st, retry_id, "t_timeout_retry")

        for row, desc in ((fail_row, fail_desc), (retry_row, retry_desc)):
            assert row.lifecycle_status == "failed"
            assert row.error_code == "TIMEOUT"
            assert_public_message_clean(row, "TIMEOUT")
            assert desc.status == WorkflowExecutionStatus.FAILED
        assert (await job_facts(db, fail_id)).usage == [(1, "TIMEOUT")]
        assert (await job_facts(db, retry_id)).usage == [(a, "TIMEOUT") for a in (1, 2, 3)]
        latencies = await rows(
            db,
            "SELECT latency_ms FROM ai_usage_log WHERE job_id IN (:a, :b)",
            a=fail_id,
            b=retry_id,
        )
        # Each attempt was cut at the definition's timeout, not at the 3 s delay.
        assert all(900 <= r.latency_ms < 2500 for r in latencies), latencies


# ---- projection ----------------------------------------------------------------------------


# A statement that fails when PostgreSQL runs it (after the writes planned before it).
FAILING_WRITE: Statement = (text("SELECT CAST('not a number' AS integer)"), {})
# The advisory lock the gated projection waits for, and the locks that wait.
GATE_LOCK = 0x5EA7ED
WAITING_LOCKS = "SELECT count(*) FROM pg_locks WHERE NOT granted"


def counting_projector(
    fail_first: int, *, in_sql: bool = False
) -> tuple[collections.Counter[uuid.UUID], Planner[synthetic.SyntheticOutput]]:
    """The synthetic projector, which fails on its first `fail_first` calls per job: it raises
    (`in_sql` False), or it plans its business row and then a write that fails in PostgreSQL
    (`in_sql`: so a failed attempt must be rolled back)."""
    calls: collections.Counter[uuid.UUID] = collections.Counter()

    def project(ctx: ProjectionContext, out: synthetic.SyntheticOutput) -> Projection:
        calls[ctx.job_id] += 1
        planned = synthetic.projection(ctx, out)
        if calls[ctx.job_id] > fail_first:
            return planned
        if not in_sql:
            raise RuntimeError(f"projector failure #{calls[ctx.job_id]}")
        return Projection([*planned.writes, FAILING_WRITE], planned.artifacts)

    return calls, project


async def test_projector_failing_once_is_retried_and_writes_once(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    calls, project = counting_projector(fail_first=1)
    jt = scripted_job_type("t_project_flaky", projection=project)
    async with engine_stack(settings, temporal_client, extra_types=[jt]) as st:
        job_id = await st.create(job_type=jt.job_type, input={"echo": {"k": 1}})
        row, _desc = await finished(st, job_id, jt.job_type)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert calls[job_id] == 2
        assert "projection failed: RuntimeError: projector failure #1" in (
            row.internal_error_message or ""
        )
        f = await job_facts(db, job_id)
        assert len(f.artifacts) == 1 and len(f.synthetic_results) == 1
        assert f.events[COMPLETED] == 1
        assert f.usage == [(1, None)]  # the provider was called once: only PROJECT retried

        # A duplicate PROJECT (e.g. a retry whose first commit's result was lost) is a no-op.
        acts = JobActivities(db, st.parts.catalog, gateway(settings), engine_config(settings))
        again = await ActivityEnvironment().run(
            acts.project,
            ProjectInput(job_id=str(job_id), output_hash=row.output_hash),
        )
        assert again == ProjectResult("succeeded", 1)
        assert calls[job_id] == 2

        # Re-running the projector and the artifact insert in a transaction writes nothing new.
        ctx = ProjectionContext(
            job_id=job_id,
            user_id=row.user_id,
            target_type=row.target_type,
            target_id=row.target_id,
            output_hash=row.output_hash,
        )
        async with db.begin() as s:
            arts: list[Artifact] = await project_in(
                s, synthetic.projection, ctx, synthetic.SyntheticOutput.model_validate(row.output)
            )
            inserted = await insert_artifacts(
                s, job_id, [(a.artifact_type, a.artifact_id, a.ordinal) for a in arts]
            )
        assert inserted == [False]
        assert await job_facts(db, job_id) == f
        # ... and the uniqueness is the database's, not only the ON CONFLICT clause's.
        with pytest.raises(IntegrityError):
            async with db.begin() as s:
                await s.execute(
                    text(
                        "INSERT INTO ai_job_artifact (job_id, artifact_type, artifact_id, "
                        "ordinal, created_at) VALUES (:j, :t, :a, 1, now())"
                    ),
                    {"j": job_id, "t": arts[0].artifact_type, "a": arts[0].artifact_id},
                )


async def test_concurrent_duplicate_projection_writes_once(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """A second PROJECT of the same output running while the first is still inside its
    transaction (e.g. a local-activity retry after a timeout): the unique keys make it wait,
    then write nothing, and the job still ends succeeded once."""
    calls: collections.Counter[uuid.UUID] = collections.Counter()

    def gated(ctx: ProjectionContext, out: synthetic.SyntheticOutput) -> Projection:
        calls[ctx.job_id] += 1
        if calls[ctx.job_id] == 1:
            # PROJECT's first try fails: its retry takes over.
            raise RuntimeError("projector failure on the first try")
        planned = synthetic.projection(ctx, out)
        if calls[ctx.job_id] != 2:
            return planned
        # The business row's insert (which holds its key), then a wait for the test's lock.
        gate = (text("SELECT pg_advisory_xact_lock(:k)"), {"k": GATE_LOCK})
        return Projection([*planned.writes, gate], planned.artifacts)

    jt = scripted_job_type("t_project_gated", projection=gated)
    async with engine_stack(settings, temporal_client, extra_types=[jt]) as st, db() as holder:
        # Held until this session's transaction ends (its rollback below, or the test's end).
        await holder.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": GATE_LOCK})
        job_id = await st.create(job_type=jt.job_type)
        # The workflow's PROJECT is mid-transaction, waiting for the lock.
        await eventually(
            lambda: scalar(db, f"{WAITING_LOCKS} AND locktype = 'advisory'"),
            timeout=30,
            what="the first projection to wait for the test's lock",
        )
        row = await st.job(job_id)
        assert row.lifecycle_status == "running" and row.output_hash is not None
        acts = JobActivities(db, st.parts.catalog, gateway(settings), engine_config(settings))
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, workflow_id=row.workflow_id)
        duplicate = asyncio.ensure_future(
            env.run(
                acts.project,
                ProjectInput(job_id=str(job_id), output_hash=row.output_hash),
            )
        )
        # The duplicate waits on the first transaction's row lock before it can go on.
        await eventually(
            lambda: scalar(db, f"{WAITING_LOCKS} AND locktype = 'transactionid'"),
            timeout=15,
            what="the duplicate projection to wait for the first",
        )
        assert calls[job_id] == 3 and not duplicate.done()
        await holder.rollback()  # the first projection goes on

        row, desc = await finished(st, job_id, jt.job_type)
        assert row.lifecycle_status == "succeeded"
        assert desc.status == WorkflowExecutionStatus.COMPLETED
        try:
            outcome: object = await asyncio.wait_for(duplicate, 15)
        except ApplicationError as exc:  # it lost the compare-and-set: a no-op, rolled back
            outcome = exc.type
        print("duplicate projection outcome:", outcome)
        assert outcome in (ProjectResult("succeeded", 1), "INTERNAL_ILLEGAL_TRANSITION")
        f = await job_facts(db, job_id)
        assert len(f.artifacts) == 1 and len(f.synthetic_results) == 1
        assert f.events.get(COMPLETED) == 1


async def test_projector_always_failing_fails_job_after_two_tries(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    calls, project = counting_projector(fail_first=1_000, in_sql=True)
    jt = scripted_job_type("t_project_broken", projection=project)
    async with engine_stack(settings, temporal_client, extra_types=[jt]) as st:
        job_id = await st.create(job_type=jt.job_type)
        row, desc = await finished(st, job_id, jt.job_type)
        assert row.lifecycle_status == "failed"
        assert row.error_code == "INTERNAL_PROJECTION_FAILED"
        assert_public_message_clean(row, "INTERNAL_PROJECTION_FAILED")
        # The PROJECT stage's two tries (EXECUTE stored the output and let its slot go).
        assert calls[job_id] == 2
        f = await job_facts(db, job_id)
        assert f.artifacts == [] and f.synthetic_results == []  # every attempt rolled back
        assert COMPLETED not in f.events and f.events.get(FAILED) == 1
        assert f.usage == [(1, None)]
        assert desc.status == WorkflowExecutionStatus.FAILED


# ---- a job whose row vanished ---------------------------------------------------------------


async def test_workflow_of_a_deleted_job_ends_failed(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """PREPARE finds no job row (deleted after its workflow was started): the workflow must
    end, failed with INTERNAL_JOB_MISSING, instead of retrying its finalizer forever."""
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        job_id = await st.create()
        assert await st.relay.run_once() == 1  # workflow started, no worker yet
        async with db.begin() as s:
            await s.execute(text("DELETE FROM ai_job WHERE id = :j"), {"j": job_id})
    async with engine_stack(settings, temporal_client, relay=False) as st:
        desc = await wait_workflow_closed(temporal_client, st.workflow_id(job_id), timeout=15)
        assert desc.status == WorkflowExecutionStatus.FAILED
        with pytest.raises(WorkflowFailureError) as exc_info:
            await temporal_client.get_workflow_handle(st.workflow_id(job_id)).result()
        cause = exc_info.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "INTERNAL_JOB_MISSING"
