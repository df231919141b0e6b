"""Private data stays in PostgreSQL, on the real stack: nothing of a job's input or output
reaches Temporal. A sentinel string travels in the job's input (`echo`) and so in its output;
the full history of every workflow involved is searched for it, as protobuf bytes (payload data
verbatim) and as JSON."""

from __future__ import annotations

import uuid

from pydantic import BaseModel
from sqlalchemy import text
from temporalio.client import Client, WorkflowExecutionStatus

from db.session import SessionMaker
from engine.contracts import (
    RECONCILER_WORKFLOW,
    ReconcileResult,
)
from engine.definition import SYSTEM_QUEUE
from engine.settings import Settings
from jobs.spec import Projection, ProjectionContext
from tests.integration.engine_helpers import (
    execute,
    history_blobs,
    scripted_job_type,
    wait_activity_started,
    wait_workflow_closed,
)
from tests.stack import INTERACTIVE, Stack, engine_stack


def sentinel() -> str:
    return f"SENTINEL-{uuid.uuid4().hex}"


async def assert_absent(client: Client, wid: str, secret: str, *, present: str) -> None:
    """`secret` is nowhere in the workflow's history; `present` (an id that must be there)
    is, which shows the search looks inside payloads."""
    raw, as_json = await history_blobs(client, wid)
    assert present.encode() in raw, f"{present} not found in {wid}: the search is blind"
    assert secret.encode() not in raw, f"{secret} leaked into the history of {wid}"
    assert secret not in as_json
    assert secret.lower() not in as_json.lower()


async def job_with_secret(st: Stack, secret: str, **extra: object) -> uuid.UUID:
    return await st.create(
        input={"echo": {"note": secret, "nested": [secret, {"k": secret}]}, **extra}
    )


async def test_succeeded_job_keeps_input_and_output_out_of_temporal(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    secret = sentinel()
    async with engine_stack(settings, temporal_client) as st:
        job_id = await job_with_secret(st, secret)
        row = await st.wait_status(job_id, timeout=30)
        assert row.lifecycle_status == "succeeded"
        assert secret in str(row.output) and secret in str(row.input)  # it did flow through
        wid = st.workflow_id(job_id)
        await wait_workflow_closed(temporal_client, wid)
        await assert_absent(temporal_client, wid, secret, present=str(job_id))


async def test_failed_jobs_keep_input_out_of_temporal(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """Failure messages carry codes and public messages only, not input or provider detail."""
    secret = sentinel()
    async with engine_stack(settings, temporal_client) as st:
        blocked = await job_with_secret(st, secret, failTimes=1, failCode="CONTENT_SAFETY_BLOCKED")
        invalid = await job_with_secret(st, secret, invalidOutput=True)
        for job_id, code in (
            (blocked, "CONTENT_SAFETY_BLOCKED"),
            (invalid, "VALIDATION_OUTPUT_INVALID"),
        ):
            row = await st.wait_status(job_id, timeout=30)
            assert row.lifecycle_status == "failed" and row.error_code == code
            wid = st.workflow_id(job_id)
            desc = await wait_workflow_closed(temporal_client, wid)
            assert desc.status == WorkflowExecutionStatus.FAILED
            await assert_absent(temporal_client, wid, secret, present=code)
            # Details meant for operators stay in SQL too.
            internal = row.internal_error_message or ""
            assert internal
            raw, _ = await history_blobs(temporal_client, wid)
            assert internal.encode() not in raw


async def test_reconciler_history_carries_no_job_data(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """The system workflow's history names jobs by id only. (The relay's shard workflows carry
    a shard number and counts only, see docs/architecture.md "Pollers".)"""
    secret = sentinel()
    async with engine_stack(settings, temporal_client, queues=(*INTERACTIVE, SYSTEM_QUEUE)) as st:
        done = await job_with_secret(st, secret)
        assert (await st.wait_status(done, timeout=30)).lifecycle_status == "succeeded"

        # A job the reconciler has to end: running, workflow gone, lock expired.
        stuck = await job_with_secret(st, secret, hang=True)
        await st.wait_status(stuck, "running", timeout=30)
        await wait_activity_started(temporal_client, st.workflow_id(stuck), "execute")
        await temporal_client.get_workflow_handle(st.workflow_id(stuck)).terminate("test")
        await execute(
            db,
            "UPDATE ai_job SET lock_until = now() - interval '10 minutes' WHERE id = :j",
            j=stuck,
        )
        rec_wid = f"reconcile-{uuid.uuid4().hex[:8]}{settings.task_queue_suffix}"
        result = await temporal_client.execute_workflow(
            RECONCILER_WORKFLOW,
            id=rec_wid,
            task_queue=settings.task_queue(SYSTEM_QUEUE),
            result_type=ReconcileResult,
        )
        assert result.expired_locks_failed == 1
        assert (await st.job(stuck)).error_code == "INTERNAL_LOCK_EXPIRED"

        await assert_absent(temporal_client, rec_wid, secret, present=str(stuck))
        for j in (done, stuck):
            await assert_absent(temporal_client, st.workflow_id(j), secret, present=str(j))


async def test_no_user_id_or_client_key_reaches_temporal(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """The workflow input names the job only: not its owner, not the client's Idempotency-Key."""
    user, key = sentinel(), sentinel()
    async with engine_stack(settings, temporal_client) as st:
        job_id = await st.create(user_id=user, idempotency_key=key)
        assert (await st.wait_status(job_id, timeout=30)).lifecycle_status == "succeeded"
        wid = st.workflow_id(job_id)
        await wait_workflow_closed(temporal_client, wid)
        await assert_absent(temporal_client, wid, user, present=str(job_id))
        await assert_absent(temporal_client, wid, key, present=str(job_id))


async def test_an_unexpected_error_reaches_temporal_as_a_code_only(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """A projector that fails with a driver error (whose text carries the failing row, job data
    included) or any other exception: Temporal records INTERNAL_* and the public message; the
    exception's own text stays out of the history, also as a failure's cause."""
    secret = sentinel()

    def leaky(ctx: ProjectionContext, out: BaseModel) -> Projection:
        # The driver's message repeats the offending value: "invalid input syntax for type
        # uuid: "SENTINEL-..."".
        return Projection([(text("SELECT CAST(:v AS uuid)"), {"v": secret})], [])

    def plain(ctx: ProjectionContext, out: BaseModel) -> Projection:
        raise RuntimeError(f"projector bug near {secret}")

    types = [
        scripted_job_type("leaky_projection", max_retries=0, projection=leaky),
        scripted_job_type("buggy_projection", max_retries=0, projection=plain),
    ]
    async with engine_stack(settings, temporal_client, extra_types=types) as st:
        for jt in types:
            # The secret is the job's own data, as it would be in a projector's message.
            job_id = await st.create(job_type=jt.job_type, input={"echo": {"note": secret}})
            row = await st.wait_status(job_id, timeout=60)
            assert row.lifecycle_status == "failed"
            assert row.error_code == "INTERNAL_PROJECTION_FAILED"
            # SUPER_ADMIN's view names the failure and its frames, never the job's data.
            internal = row.internal_error_message or ""
            assert "projection failed: " in internal and "engine frames" in internal, internal
            assert secret not in internal, internal
            wid = st.workflow_id(job_id, jt.job_type)
            await wait_workflow_closed(temporal_client, wid)
            await assert_absent(temporal_client, wid, secret, present="INTERNAL_PROJECTION_FAILED")
            _, as_json = await history_blobs(temporal_client, wid)
            for leak in ("invalid input syntax", "RuntimeError", "DataError", "psycopg"):
                assert leak not in as_json, f"{leak} reached the history of {wid}"
