"""Retries spend the owner's money, over real HTTP on real PostgreSQL and Temporal: an admin
retry past the owner's quota is a 429 problem+json `QUOTA_EXCEEDED` with Retry-After, unless the
admin overrides it (recorded on the audit entry); a bulk retry counts such jobs in `refused`,
never in `done`, unless the operation was submitted with the override."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from engine.definition import SYSTEM_QUEUE
from tests.e2e.conftest import Api, assert_problem, fast_bulk, start_api
from tests.integration.engine_helpers import make_failed_jobs, retries_of
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
    async with db.begin() as s:
        await s.execute(text("TRUNCATE bulk_operation, admin_audit RESTART IDENTITY CASCADE"))
    return db


@pytest.fixture
async def quota_stack(
    db: SessionMaker, env: Any, temporal_client: Client, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Stack]:
    """An `ai-system` worker and a relay under a quota of 2 jobs per user per day (the failed
    originals count: they were created today), and no job worker: retries stay queued."""
    fast_bulk(monkeypatch)
    settings = env(ADMIN_BULK_MAX_JOBS=400, QUOTA_MAX_JOBS_PER_DAY=2)
    async with engine_stack(settings, temporal_client, queues=(SYSTEM_QUEUE,)) as st:
        yield st


async def test_an_admin_retry_past_the_owners_quota_is_429_unless_overridden(
    quota_stack: Stack, db: SessionMaker, temporal_client: Client
) -> None:
    st = quota_stack
    job, _other = await make_failed_jobs(st.service, db, 2, users=("frank",))
    async with start_api(st.settings, temporal=temporal_client) as api:
        url = f"/admin-api/ai/jobs/{job}/retry"
        refused = await api.http.post(url, headers=api.as_admin())
        assert_problem(refused, 429, "QUOTA_EXCEEDED")
        assert int(refused.headers["retry-after"]) > 0
        empty_body = await api.http.post(url, json={}, headers=api.as_admin())
        assert_problem(empty_body, 429, "QUOTA_EXCEEDED")
        assert await retries_of(db, [job]) == {}
        bad = await api.http.post(url, json={"overrideBudget": "maybe"}, headers=api.as_admin())
        assert_problem(bad, 422, "VALIDATION_FAILED")

        r = await api.http.post(url, json={"overrideBudget": True}, headers=api.as_admin())
        assert r.status_code == 201, r.text
        retry_id = r.json()["jobId"]
        audit = await api.http.get(
            "/admin-api/ai/audit", params={"action": "job.retry"}, headers=api.as_admin()
        )
        entries = [(e["outcome"], e["detail"]) for e in audit.json()["items"]]
    assert entries[0] == ("retried", {"retryJobId": retry_id, "overrideBudget": True})
    assert [o for o, _ in entries[1:]] == ["QUOTA_EXCEEDED", "QUOTA_EXCEEDED"]
    assert await retries_of(db, [job]) == {job: 1}


async def test_a_bulk_retry_counts_refused_jobs_and_the_override_retries_them(
    quota_stack: Stack, db: SessionMaker, temporal_client: Client
) -> None:
    st = quota_stack
    # gina has 3 jobs today (past her quota of 2); hank has 1 (room for one more).
    ginas = await make_failed_jobs(st.service, db, 3, users=("gina",))
    (hanks,) = await make_failed_jobs(st.service, db, 1, users=("hank",))
    body = {"status": "failed"}
    async with start_api(st.settings, temporal=temporal_client) as api:
        cancel = await api.http.post(
            "/admin-api/ai/bulk/cancel",
            json={**body, "overrideBudget": True},
            headers=api.as_admin(),
        )
        assert_problem(cancel, 422, "VALIDATION_FAILED")
        r = await api.http.post("/admin-api/ai/bulk/retry", json=body, headers=api.as_admin())
        assert r.status_code == 202, r.text
        final = await wait_completed(api, r.json()["operationId"])
        assert (final["done"], final["refused"], final["skipped"], final["failed"]) == (
            1,
            3,
            0,
            0,
        ), final
        assert final["refusedReasons"] == {"QUOTA_EXCEEDED": 3}, final
        assert await retries_of(db, ginas) == {}
        assert await retries_of(db, [hanks]) == {hanks: 1}

        over = await api.http.post(
            "/admin-api/ai/bulk/retry",
            json={**body, "overrideBudget": True},
            headers=api.as_admin(),
        )
        assert over.status_code == 202, over.text
        again = await wait_completed(api, over.json()["operationId"])
        assert "overrideBudget" not in again["filter"], again
        assert (again["done"], again["refused"]) == (3, 0), again
        assert again["skippedReasons"] == {"already_retried": 1}, again
        audit = await api.http.get(
            "/admin-api/ai/audit", params={"action": "bulk.retry"}, headers=api.as_admin()
        )
    accepted = [e for e in audit.json()["items"] if e["outcome"] == "accepted"]
    assert [e["detail"].get("overrideBudget") for e in accepted] == [True, None]
    assert await retries_of(db, ginas) == dict.fromkeys(ginas, 1)
