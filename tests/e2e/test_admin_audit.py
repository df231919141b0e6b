"""The admin audit log over real HTTP: every admin action and view of internals leaves one entry
with its actor, target and outcome (refusals included), readable by SUPER_ADMIN only, filtered by
actor, action and time, paged by cursor, never carrying job data; entries are purged after the
retention setting, in bounded batches, by the reconciler's retention phase.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client

from activities.reconciler import Reconciler
from db import audit as audit_db
from db.session import SessionMaker
from engine.settings import Settings
from runtime.wiring import reconciler_config
from tests.e2e.conftest import Api, assert_problem

SENTINEL = "audit-sentinel-5d1e"  # lives only in a job's input: never in the audit log
PATH = "/admin-api/ai/audit"


@pytest.fixture(autouse=True)
async def admin_tables(db: SessionMaker) -> SessionMaker:
    async with db.begin() as s:
        await s.execute(text("TRUNCATE bulk_operation, admin_audit RESTART IDENTITY CASCADE"))
    return db


async def audit(api: Api, **params: Any) -> list[dict[str, Any]]:
    """Every entry matching `params`, following the cursor with small pages."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        q = {**params, "limit": 3, **({"cursor": cursor} if cursor else {})}
        r = await api.http.get(PATH, params=q, headers=api.as_admin())
        assert r.status_code == 200, r.text
        assert SENTINEL not in r.text
        items.extend(r.json()["items"])
        cursor = r.json()["nextCursor"]
        if cursor is None:
            return items


async def test_every_admin_action_is_recorded_with_actor_and_outcome(api: Api) -> None:
    root, ops = api.as_admin("root"), api.as_admin("ops")
    job = await api.create_id("alice", input={"echo": {"note": SENTINEL}})
    other = await api.create_id("bob")
    missing = "00000000-0000-4000-8000-000000000000"

    assert (await api.http.get(f"/admin-api/ai/jobs/{job}", headers=root)).status_code == 200
    assert (await api.http.get(f"/admin-api/ai/jobs/{missing}", headers=root)).status_code == 404
    assert (await api.http.get("/admin-api/ai/jobs", headers=root)).status_code == 200
    assert (
        await api.http.post(f"/admin-api/ai/jobs/{job}/cancel", headers=root)
    ).status_code == 200
    assert (await api.http.post(f"/admin-api/ai/jobs/{job}/cancel", headers=ops)).status_code == 409
    retry = await api.http.post(f"/admin-api/ai/jobs/{job}/retry", headers=ops)
    assert retry.status_code == 201, retry.text
    retry_id = retry.json()["jobId"]
    assert (await api.http.post(f"/admin-api/ai/jobs/{job}/retry", headers=ops)).status_code == 200
    assert (
        await api.http.post(f"/admin-api/ai/jobs/{other}/retry", headers=ops)
    ).status_code == 409
    dry = await api.http.post(
        "/admin-api/ai/bulk/cancel", json={"userId": "bob", "dryRun": True}, headers=ops
    )
    assert dry.status_code == 200, dry.text
    assert (await api.http.post("/admin-api/ai/outbox/1/requeue", headers=root)).status_code in (
        200,
        409,
    )
    replay = await api.http.post("/admin-api/ai/webhook-deliveries/999999/replay", headers=root)
    assert replay.status_code == 404

    entries = await audit(api)
    seen = [(e["actor"], e["action"], e["targetId"], e["outcome"]) for e in reversed(entries)]
    assert seen == [
        ("root", "job.view", job, "ok"),
        ("root", "job.view", missing, "JOB_NOT_FOUND"),
        ("root", "job.list", None, "ok"),
        ("root", "job.cancel", job, "cancelled"),
        ("ops", "job.cancel", job, "JOB_ALREADY_CANCELLED"),
        ("ops", "job.retry", job, "retried"),
        ("ops", "job.retry", job, "already_retried"),
        ("ops", "job.retry", other, "JOB_NOT_RETRYABLE"),
        ("ops", "bulk.cancel", None, "dry_run"),
        seen[9],  # the requeue of event 1: requeued or refused, recorded either way
        ("root", "webhook_delivery.replay", "999999", "WEBHOOK_DELIVERY_NOT_FOUND"),
    ], seen
    assert seen[9][:3] == ("root", "outbox.requeue", "1")
    assert seen[9][3] in ("requeued", "OUTBOX_NOT_REQUEUEABLE")
    by_action = {(e["action"], e["outcome"]): e for e in entries}
    assert by_action[("job.retry", "retried")]["detail"] == {"retryJobId": retry_id}
    assert by_action[("bulk.cancel", "dry_run")]["detail"] == {
        "filter": {"userId": "bob"},
        "matched": 1,
    }
    for e in entries:
        assert e["targetType"] and datetime.fromisoformat(e["createdAt"])

    # Filters: actor, action, time window.
    assert {e["actor"] for e in await audit(api, actor="ops")} == {"ops"}
    assert len(await audit(api, actor="ops")) == 5
    cancels = await audit(api, action="job.cancel")
    assert [e["outcome"] for e in cancels] == ["JOB_ALREADY_CANCELLED", "cancelled"]
    later = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    earlier = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    assert await audit(api, **{"from": later}) == []
    assert await audit(api, to=earlier) == []
    assert len(await audit(api, **{"from": earlier, "to": later})) == len(entries)


async def test_the_audit_log_is_for_admins_only(api: Api) -> None:
    r = await api.http.get(PATH, headers=api.as_user())
    assert_problem(r, 403, "FORBIDDEN")
    r = await api.http.get(PATH)
    assert_problem(r, 401, "UNAUTHENTICATED")
    r = await api.http.get(PATH, params={"cursor": "bm9wZQ"}, headers=api.as_admin())
    assert_problem(r, 422, "VALIDATION_FAILED")
    r = await api.http.get(PATH, params={"from": "12345"}, headers=api.as_admin())
    assert_problem(r, 422, "VALIDATION_FAILED")


async def test_old_entries_are_purged_in_bounded_batches_by_the_reconciler(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with db.begin() as s:
        for i in range(5):
            await audit_db.insert(
                s, actor="old", action="job.view", target_type="job", target_id=str(i), outcome="ok"
            )
        await audit_db.insert(
            s, actor="new", action="job.view", target_type="job", target_id="n", outcome="ok"
        )
        await s.execute(
            text(
                "UPDATE admin_audit SET created_at = now() - interval '400 days' "
                "WHERE actor = 'old'"
            )
        )
    async with db.begin() as s:
        assert await audit_db.purge_older_than(s, days=365, limit=3) == 3
    # The reconciler's retention phase, with the setting's retention: the rest goes.
    assert settings.retention_days["admin_audit"] == 365
    rec = Reconciler(
        db,
        temporal_client,
        reconciler_config(settings),
    )
    await rec.run_once()
    async with db() as s:
        left = (await s.execute(text("SELECT actor FROM admin_audit"))).scalars().all()
    assert left == ["new"]
