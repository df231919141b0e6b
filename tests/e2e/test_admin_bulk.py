"""Admins at scale, over real HTTP on real PostgreSQL and Temporal: cancel any user's job with
the owner's semantics, and bulk cancel/retry by filter (dry run, a paced workflow acting on each
job once, status with reasons, a limit per operation).

The bulk tests run a dedicated API, an in-process `ai-system` worker and a relay (which starts
the bulk workflow from its outbox row) on one task queue suffix, and no job worker: the retries
a bulk retry creates stay queued, so what the test counts is exactly what the operation did.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from engine.definition import SYSTEM_QUEUE
from tests.e2e.conftest import Api, assert_problem, fast_bulk, start_api
from tests.integration.engine_helpers import OUTAGE, make_failed_jobs, retries_of
from tests.stack import Stack, engine_stack
from tests.support import eventually


async def wait_completed(api: Api, operation_id: str, timeout: float = 30.0) -> dict[str, Any]:
    last: dict[str, Any] = {}

    async def completed() -> dict[str, Any] | None:
        nonlocal last
        r = await api.http.get(f"/admin-api/ai/bulk/{operation_id}", headers=api.as_admin())
        assert r.status_code == 200, r.text
        last = r.json()
        return last if last["status"] == "completed" else None

    return await eventually(
        completed, timeout=timeout, interval=0.2, what=lambda: f"bulk to complete ({last})"
    )


@pytest.fixture(autouse=True)
async def admin_tables(db: SessionMaker) -> SessionMaker:
    """The suite's truncate predates these tables: start each test without operations or audit
    entries (the items go with ai_job, by their foreign key)."""
    async with db.begin() as s:
        await s.execute(text("TRUNCATE bulk_operation, admin_audit RESTART IDENTITY CASCADE"))
    return db


@pytest.fixture
async def bulk_api(
    db: SessionMaker, env: Any, temporal_client: Client, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Stack]:
    """An `ai-system` worker and a relay; tests start an API on the same settings."""
    fast_bulk(monkeypatch)
    settings = env(ADMIN_BULK_MAX_JOBS=400)
    async with engine_stack(settings, temporal_client, queues=(SYSTEM_QUEUE,)) as st:
        yield st


# ---- admin cancel -----------------------------------------------------------------------


async def test_admin_cancels_another_users_queued_job(api: Api) -> None:
    job_id = await api.create_id("alice")
    r = await api.http.post(f"/admin-api/ai/jobs/{job_id}/cancel", headers=api.as_admin())
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["cancelOutcome"] == "cancelled" and body["lifecycleStatus"] == "cancelled"
    assert body["jobId"] == job_id
    # Terminal now: the owner's refusal, as problem+json.
    again = await api.http.post(f"/admin-api/ai/jobs/{job_id}/cancel", headers=api.as_admin())
    assert_problem(again, 409, "JOB_ALREADY_CANCELLED")
    # Not an admin: forbidden even on one's own job's admin route.
    mine = await api.http.post(f"/admin-api/ai/jobs/{job_id}/cancel", headers=api.as_user())
    assert_problem(mine, 403, "FORBIDDEN")
    missing = await api.http.post(
        f"/admin-api/ai/jobs/{uuid.uuid4()}/cancel", headers=api.as_admin()
    )
    assert_problem(missing, 404, "JOB_NOT_FOUND")


async def test_admin_cancels_another_users_running_job(api: Api, workers: Stack) -> None:
    job_id = await api.create_id("bob", input={"hang": True})
    await api.wait_status(job_id, "running", user="bob")
    r = await api.http.post(f"/admin-api/ai/jobs/{job_id}/cancel", headers=api.as_admin())
    assert r.status_code == 202, r.text
    assert r.json()["cancelOutcome"] == "cancel_requested"
    done = await api.wait_status(job_id, "cancelled", "succeeded", "failed", user="bob")
    assert done["lifecycleStatus"] == "cancelled", done


async def test_admin_cancel_of_a_finished_job_is_refused(api: Api, workers: Stack) -> None:
    job_id = await api.create_id("carol")
    await api.wait_status(job_id, "succeeded", user="carol")
    r = await api.http.post(f"/admin-api/ai/jobs/{job_id}/cancel", headers=api.as_admin())
    assert_problem(r, 409, "JOB_NOT_CANCELLABLE")


# ---- bulk -------------------------------------------------------------------------------


async def test_bulk_retry_after_an_outage_dry_run_then_once_then_all_skipped(
    bulk_api: Stack, db: SessionMaker, temporal_client: Client
) -> None:
    st = bulk_api
    failed = await make_failed_jobs(st.service, db, 300)
    # Noise the filter must leave alone: another error code, and a queued job.
    other = await make_failed_jobs(st.service, db, 3, code="CONTENT_SAFETY_BLOCKED")
    queued = await st.create("alice", target_type="lesson")
    body = {"status": "failed", "errorCode": OUTAGE}
    async with start_api(st.settings, temporal=temporal_client) as api:
        dry = await api.http.post(
            "/admin-api/ai/bulk/retry", json={**body, "dryRun": True}, headers=api.as_admin()
        )
        assert dry.status_code == 200, dry.text
        assert dry.json()["matched"] == 300
        sample = dry.json()["sample"]
        assert len(sample) == 20 and set(sample) <= {str(j) for j in failed}
        assert await retries_of(db, failed) == {}, "a dry run changed something"

        r = await api.http.post("/admin-api/ai/bulk/retry", json=body, headers=api.as_admin())
        assert r.status_code == 202, r.text
        op = r.json()
        assert op["matched"] == 300 and r.headers["location"].endswith(op["operationId"])
        final = await wait_completed(api, op["operationId"])
        async with db() as s:
            started_by = (
                await s.execute(
                    text("SELECT status FROM outbox_event WHERE aggregate_id = :id"),
                    {"id": op["operationId"]},
                )
            ).scalar_one()
        assert started_by == "published", "the relay did not start the workflow"
        assert (final["done"], final["skipped"], final["failed"], final["pending"]) == (
            300,
            0,
            0,
            0,
        ), final
        assert final["workflowId"] == f"bulk:{op['operationId']}"
        assert await retries_of(db, failed) == dict.fromkeys(failed, 1)
        assert await retries_of(db, [*other, queued]) == {}

        # The same request again: a new operation, every item skipped as already retried.
        r2 = await api.http.post("/admin-api/ai/bulk/retry", json=body, headers=api.as_admin())
        assert r2.status_code == 202, r2.text
        assert r2.json()["operationId"] != op["operationId"]
        again = await wait_completed(api, r2.json()["operationId"])
        assert again["matched"] == 300 and again["done"] == 0, again
        assert again["skippedReasons"] == {"already_retried": 300}, again
        assert await retries_of(db, failed) == dict.fromkeys(failed, 1)

    # The workflow ran in Temporal, where an operator can find it.
    handle = temporal_client.get_workflow_handle(final["workflowId"])
    assert (await handle.result())["done"] == 300


async def test_bulk_retry_skips_jobs_that_are_not_failed_with_reasons(
    bulk_api: Stack, db: SessionMaker, temporal_client: Client
) -> None:
    st = bulk_api
    failed = await make_failed_jobs(st.service, db, 2, users=("dave",))
    queued = [await st.create("dave", target_type="lesson") for _ in range(3)]
    async with start_api(st.settings, temporal=temporal_client) as api:
        r = await api.http.post(
            "/admin-api/ai/bulk/retry", json={"userId": "dave"}, headers=api.as_admin()
        )
        assert r.status_code == 202, r.text
        final = await wait_completed(api, r.json()["operationId"])
    assert final["done"] == 2 and final["skippedReasons"] == {"not_failed": 3}, final
    assert await retries_of(db, failed) == dict.fromkeys(failed, 1)
    assert await retries_of(db, queued) == {}


async def test_bulk_cancel_of_a_filter_matching_too_much_is_refused_with_the_count(
    db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    settings = env(ADMIN_BULK_MAX_JOBS=5)
    async with start_api(settings, temporal=temporal_client) as api:
        for _ in range(7):
            await api.create("erin")
        r = await api.http.post(
            "/admin-api/ai/bulk/cancel",
            json={"userId": "erin", "status": "queued"},
            headers=api.as_admin(),
        )
        problem = assert_problem(r, 422, "BULK_TOO_LARGE")
        assert problem["matched"] == 7 and problem["limit"] == 5, problem
        # Nothing was frozen or cancelled.
        async with db() as s:
            ops = (await s.execute(text("SELECT count(*) FROM bulk_operation"))).scalar_one()
            queued = (
                await s.execute(
                    text("SELECT count(*) FROM ai_job WHERE lifecycle_status = 'queued'")
                )
            ).scalar_one()
        assert (ops, queued) == (0, 7)
        # A dry run of the same filter still answers, with the count.
        dry = await api.http.post(
            "/admin-api/ai/bulk/cancel",
            json={"userId": "erin", "dryRun": True},
            headers=api.as_admin(),
        )
        assert dry.status_code == 200 and dry.json()["matched"] == 7, dry.text


async def test_bulk_cancel_cancels_queued_jobs_once_and_skips_ended_ones(
    bulk_api: Stack, db: SessionMaker, temporal_client: Client
) -> None:
    st = bulk_api
    queued = [await st.create("frank", target_type="lesson") for _ in range(4)]
    failed = await make_failed_jobs(st.service, db, 2, users=("frank",))
    async with start_api(st.settings, temporal=temporal_client) as api:
        headers = {**api.as_admin(), "Idempotency-Key": "incident-42"}
        r = await api.http.post(
            "/admin-api/ai/bulk/cancel", json={"userId": "frank"}, headers=headers
        )
        assert r.status_code == 202, r.text
        # The same key: the same operation, not a second one.
        same = await api.http.post(
            "/admin-api/ai/bulk/cancel", json={"userId": "frank"}, headers=headers
        )
        assert same.status_code == 200 and same.json()["operationId"] == r.json()["operationId"]
        final = await wait_completed(api, r.json()["operationId"])
        assert final["done"] == 4 and final["skippedReasons"] == {"already_finished": 2}, final
        for job_id in queued:
            assert (await api.get(str(job_id), "frank"))["lifecycleStatus"] == "cancelled"
        for job_id in failed:
            assert (await api.get(str(job_id), "frank"))["lifecycleStatus"] == "failed"


async def test_bulk_routes_are_for_admins_only(api: Api) -> None:
    for method, path, body in (
        ("POST", "/admin-api/ai/bulk/cancel", {"dryRun": True}),
        ("POST", "/admin-api/ai/bulk/retry", {"dryRun": True}),
        ("GET", f"/admin-api/ai/bulk/{uuid.uuid4()}", None),
    ):
        r = await api.http.request(method, path, json=body, headers=api.as_user())
        assert_problem(r, 403, "FORBIDDEN")
    r = await api.http.get(f"/admin-api/ai/bulk/{uuid.uuid4()}", headers=api.as_admin())
    assert_problem(r, 404, "BULK_OPERATION_NOT_FOUND")
    bad = await api.http.post(
        "/admin-api/ai/bulk/retry", json={"status": "nope"}, headers=api.as_admin()
    )
    assert_problem(bad, 422, "VALIDATION_FAILED")


async def test_an_operation_no_relay_started_is_started_by_its_next_read(
    db: SessionMaker, env: Any, temporal_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast_bulk(monkeypatch, start_after_s=0)
    settings = env()
    # A worker for the bulk workflow, but no relay: its `ai.bulk.start` row stays pending.
    async with (
        engine_stack(settings, temporal_client, queues=(SYSTEM_QUEUE,), relay=False) as st,
        start_api(settings, temporal=temporal_client) as api,
    ):
        failed = await make_failed_jobs(st.service, db, 3, users=("gina",))
        r = await api.http.post(
            "/admin-api/ai/bulk/retry", json={"userId": "gina"}, headers=api.as_admin()
        )
        assert r.status_code == 202, r.text
        operation_id = r.json()["operationId"]
        async with db() as s:
            row = (
                await s.execute(
                    text(
                        "SELECT o.status, b.workflow_started_at FROM outbox_event o "
                        "JOIN bulk_operation b ON b.id::text = o.aggregate_id "
                        "WHERE o.event_type = 'ai.bulk.start' AND b.id = :id"
                    ),
                    {"id": operation_id},
                )
            ).one()
        assert (row.status, row.workflow_started_at) == ("pending", None)
        assert await retries_of(db, failed) == {}
        # Reading it (past START_AFTER_S) starts it, and it completes.
        final = await wait_completed(api, operation_id)
    assert final["done"] == 3, final
    assert await retries_of(db, failed) == dict.fromkeys(failed, 1)
