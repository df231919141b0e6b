"""Operators see and repair: the admin outbox list, requeue, and the `stuck` member of the admin
job view, over real HTTP on real PostgreSQL and Temporal.

Determinism: the shared `api` server runs no relay, so a job created through it keeps its enqueue
event `pending` until the test itself moves it (to `dead`, `published`...). Only then does a test
start workers and a relay, when it wants the job to really run.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import text
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from db import outbox as outbox_db
from db.outbox import ENQUEUE, NOTIFY_CHANNEL
from db.session import SessionMaker, libpq_url
from tests.e2e.conftest import Api, assert_problem
from tests.stack import INTERACTIVE, Stack, engine_stack
from tests.support import eventually

PATH = "/admin-api/ai/outbox"
ITEM_KEYS = {
    "id",
    "eventType",
    "aggregateId",
    "status",
    "attemptCount",
    "availableAt",
    "lockedBy",
    "lastError",
    "publishedAt",
    "createdAt",
    "jobId",
}
SENTINEL = "payload-sentinel-9c41e"  # lives only inside payloads: must never be served


async def insert_event(
    db: SessionMaker,
    *,
    status: str = "pending",
    event_type: str = ENQUEUE,
    job_id: str | None = None,
    payload: dict[str, Any] | None = None,
    attempts: int = 0,
    available_in_s: float = 0.0,
    last_error: str | None = None,
) -> int:
    """An outbox row through the repository, then put into `status` by SQL."""
    job_id = job_id or str(uuid.uuid4())
    async with db.begin() as s:
        event_id = await outbox_db.insert(
            s,
            event_type=event_type,
            aggregate_type="AiJob",
            aggregate_id=job_id,
            dedupe_key=f"test:{uuid.uuid4()}",
            payload=payload
            if payload is not None
            else {
                "jobId": job_id,
                "jobType": "synthetic",
                "queueName": "ai-interactive",
                "priority": 50,
                "note": SENTINEL,
            },
            notify=False,
        )
        assert event_id is not None
        await s.execute(
            text(
                """
                UPDATE outbox_event SET status = CAST(:st AS text), attempt_count = :n,
                       last_error = :err,
                       available_at = now() + make_interval(secs => :later),
                       locked_by = CASE WHEN CAST(:st AS text) = 'processing' THEN 'relay:test' END,
                       locked_at = CASE WHEN CAST(:st AS text) = 'processing' THEN now() END,
                       published_at = CASE WHEN CAST(:st AS text) = 'published' THEN now() END
                WHERE id = :id
                """
            ),
            {
                "st": status,
                "n": attempts,
                "err": last_error,
                "later": available_in_s,
                "id": event_id,
            },
        )
    return event_id


async def row_of(db: SessionMaker, event_id: int) -> dict[str, Any]:
    async with db() as s:
        r = (
            await s.execute(
                text(
                    "SELECT status, attempt_count, available_at, last_error, now() AS db_now "
                    "FROM outbox_event WHERE id = :id"
                ),
                {"id": event_id},
            )
        ).one()
        return dict(r._mapping)


async def enqueue_event_of(db: SessionMaker, job_id: str) -> int:
    async with db() as s:
        return int(
            (
                await s.execute(
                    text("SELECT id FROM outbox_event WHERE aggregate_id = :j AND event_type = :e"),
                    {"j": job_id, "e": ENQUEUE},
                )
            ).scalar_one()
        )


async def set_enqueue(db: SessionMaker, job_id: str, sql_set: str) -> int:
    """Forces the job's enqueue event into a state (the `api` server has no relay to race)."""
    event_id = await enqueue_event_of(db, job_id)
    async with db.begin() as s:
        await s.execute(text(f"UPDATE outbox_event SET {sql_set} WHERE id = :id"), {"id": event_id})
    return event_id


async def page(api: Api, **params: Any) -> dict[str, Any]:
    r = await api.http.get(PATH, headers=api.as_admin(), params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def stuck_of(api: Api, job_id: str) -> dict[str, Any] | None:
    body = await api.admin_get(job_id)
    assert "stuck" in body
    stuck: dict[str, Any] | None = body["stuck"]
    return stuck


# ---- list --------------------------------------------------------------------------------


async def test_list_filters_newest_first_and_never_shows_payloads(
    api: Api, db: SessionMaker
) -> None:
    job = str(uuid.uuid4())
    dead = await insert_event(db, status="dead", job_id=job, attempts=3, last_error="E" * 2000)
    published = await insert_event(db, status="published")
    other = await insert_event(
        db, status="dead", event_type="ai.job.completed", payload={"jobId": job, "x": SENTINEL}
    )
    no_job = await insert_event(db, status="failed", payload={"only": SENTINEL})

    r = await api.http.get(PATH, headers=api.as_admin(), params={"limit": 100})
    assert r.status_code == 200, r.text
    assert SENTINEL not in r.text
    for payload_key in ("jobType", "queueName", "priority", "note", "payload", "dedupeKey"):
        assert f'"{payload_key}"' not in r.text, payload_key
    body = r.json()
    assert body["nextCursor"] is None
    assert [i["id"] for i in body["items"]] == [no_job, other, published, dead]
    for item in body["items"]:
        assert set(item) == ITEM_KEYS, item

    by_id = {i["id"]: i for i in body["items"]}
    d = by_id[dead]
    assert (d["status"], d["attemptCount"], d["eventType"]) == ("dead", 3, ENQUEUE)
    assert d["jobId"] == job and d["aggregateId"] == job
    assert d["lastError"] == "E" * 500  # stored 2000, served 500
    assert by_id[published]["publishedAt"] is not None
    assert by_id[no_job]["jobId"] is None

    assert [i["id"] for i in (await page(api, status="dead"))["items"]] == [other, dead]
    assert [i["id"] for i in (await page(api, status="dead", eventType=ENQUEUE))["items"]] == [dead]
    assert [i["id"] for i in (await page(api, status="published"))["items"]] == [published]
    assert (await page(api, status="processing"))["items"] == []
    assert (await page(api, eventType="no.such.event"))["items"] == []


async def test_paging_is_keyset_and_stable_under_inserts_and_changes(
    api: Api, db: SessionMaker
) -> None:
    originals = [await insert_event(db, status="dead") for _ in range(7)]
    await insert_event(db, status="published")  # filtered out, in the middle of the ids
    originals.append(await insert_event(db, status="dead"))
    expected = originals[::-1]

    seen: list[int] = []
    cursors: list[str] = []
    params: dict[str, Any] = {"status": "dead", "limit": 3}
    for _ in range(10):
        body = await page(api, **params)
        seen.extend(i["id"] for i in body["items"])
        if body["nextCursor"] is None:
            break
        cursors.append(body["nextCursor"])
        params["cursor"] = body["nextCursor"]
        # Between pages: newer rows arrive, and a row already served is requeued.
        await insert_event(db, status="dead")
        async with db.begin() as s:
            await s.execute(
                text("UPDATE outbox_event SET status = 'pending' WHERE id = :id"), {"id": seen[0]}
            )
    # Newer rows sort before the cursor, so no duplicate and no gap.
    assert seen == expected
    assert len(cursors) == 2
    for c in cursors:
        assert not c.isdigit(), c  # opaque: not the bare id

    # A page that ends exactly at the last row has no next cursor.
    await insert_event(db, status="failed")
    body = await page(api, status="failed", limit=1)
    assert len(body["items"]) == 1 and body["nextCursor"] is None


async def test_list_rejects_bad_filters(api: Api) -> None:
    for params in (
        {"status": "gone"},
        {"status": "DEAD"},
        {"limit": "0"},
        {"limit": "101"},
        {"eventType": "a" * 65},
        {"eventType": "bad type"},
        {"cursor": "not-a-cursor"},
        {"cursor": "b3V0Ym94Oi0x"},  # "outbox:-1"
        {"cursor": "MjAyMC0wMS0wMXwx"},  # a jobs cursor, not ours
    ):
        r = await api.http.get(PATH, headers=api.as_admin(), params=params)
        assert_problem(r, 422, "VALIDATION_FAILED")


async def test_outbox_routes_are_super_admin_only(api: Api, db: SessionMaker) -> None:
    event_id = await insert_event(db, status="dead", attempts=3)
    requeue = f"{PATH}/{event_id}/requeue"
    for headers in ({}, api.forged(), api.expired("root")):
        assert_problem(await api.http.get(PATH, headers=headers), 401, "UNAUTHENTICATED")
        assert_problem(await api.http.post(requeue, headers=headers), 401, "UNAUTHENTICATED")
    user = api.as_user("alice")
    assert_problem(await api.http.get(PATH, headers=user), 403, "FORBIDDEN")
    assert_problem(await api.http.post(requeue, headers=user), 403, "FORBIDDEN")
    # Auth comes before validation: a bad filter does not tell an outsider anything.
    r = await api.http.get(PATH, headers=user, params={"status": "gone"})
    assert_problem(r, 403, "FORBIDDEN")
    # Refused calls changed nothing.
    row = await row_of(db, event_id)
    assert (row["status"], row["attempt_count"]) == ("dead", 3)


# ---- requeue -----------------------------------------------------------------------------


async def test_requeue_states_and_errors(api: Api, db: SessionMaker, database_url: str) -> None:
    h = api.as_admin()
    dead = await insert_event(db, status="dead", attempts=3, last_error="StartError: boom")
    failed = await insert_event(db, status="failed", attempts=1)
    backing_off = await insert_event(db, status="pending", attempts=2, available_in_s=3600)
    published = await insert_event(db, status="published", attempts=1)
    processing = await insert_event(db, status="processing", attempts=1)

    listener = await psycopg.AsyncConnection.connect(libpq_url(database_url), autocommit=True)
    try:
        await listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        r = await api.http.post(f"{PATH}/{dead}/requeue", headers=h)
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == ITEM_KEYS
        assert (body["id"], body["status"], body["attemptCount"]) == (dead, "pending", 0)
        assert body["lastError"] == "StartError: boom"  # kept until the next failure
        assert body["lockedBy"] is None
        # The relays are woken, not left to their poll interval.
        notes = [n async for n in listener.notifies(timeout=5, stop_after=1)]
        assert [n.channel for n in notes] == [NOTIFY_CHANNEL]
    finally:
        await listener.close()
    row = await row_of(db, dead)
    assert (row["status"], row["attempt_count"]) == ("pending", 0)
    assert row["available_at"] <= row["db_now"]

    for event_id in (failed, backing_off):
        r = await api.http.post(f"{PATH}/{event_id}/requeue", headers=h)
        assert r.status_code == 200, r.text
        assert (r.json()["status"], r.json()["attemptCount"]) == ("pending", 0)
        row = await row_of(db, event_id)
        assert row["available_at"] <= row["db_now"], "must be available now"
    # Requeueing a pending row again is harmless.
    r = await api.http.post(f"{PATH}/{backing_off}/requeue", headers=h)
    assert r.status_code == 200 and r.json()["status"] == "pending"

    for event_id, status in ((published, "published"), (processing, "processing")):
        r = await api.http.post(f"{PATH}/{event_id}/requeue", headers=h)
        body = assert_problem(r, 409, "OUTBOX_NOT_REQUEUEABLE")
        assert status in body["detail"]
        row = await row_of(db, event_id)
        assert (row["status"], row["attempt_count"]) == (status, 1)

    assert_problem(
        await api.http.post(f"{PATH}/{processing + 1000}/requeue", headers=h),
        404,
        "OUTBOX_EVENT_NOT_FOUND",
    )
    for bad in ("abc", "0", "-1", str(2**63)):
        r = await api.http.post(f"{PATH}/{bad}/requeue", headers=h)
        assert_problem(r, 422, "VALIDATION_FAILED")


async def test_requeued_dead_enqueue_really_runs_the_job(
    api: Api, db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    """The job is created while no relay runs, so its enqueue event is still `pending` when the
    test marks it dead: nothing else can have published it. Then a relay and workers start: the
    relay ignores the dead row until the operator's requeue, after which the job succeeds."""
    job = await api.create_id()
    event_id = await set_enqueue(
        db, job, "status = 'dead', attempt_count = 3, last_error = 'RPCError: unavailable'"
    )
    stuck = await stuck_of(api, job)
    assert stuck is not None and stuck["reason"] == "DEAD_ENQUEUE"
    assert str(event_id) in stuck["detail"] and "RPCError: unavailable" in stuck["detail"]
    assert stuck["since"] is not None

    async with engine_stack(env(), temporal_client, queues=INTERACTIVE):
        await asyncio.sleep(1.0)  # several relay polls (0.2 s): a dead row is never claimed
        assert (await api.get(job))["lifecycleStatus"] == "queued"
        assert (await row_of(db, event_id))["status"] == "dead"

        r = await api.http.post(f"{PATH}/{event_id}/requeue", headers=api.as_admin())
        assert r.status_code == 200, r.text
        assert (r.json()["status"], r.json()["attemptCount"]) == ("pending", 0)
        assert r.json()["jobId"] == job

        done = await api.wait_status(job)
        assert done["lifecycleStatus"] == "succeeded", done

    assert (await row_of(db, event_id))["status"] == "published"
    assert await stuck_of(api, job) is None  # a healthy, finished job
    # Once published, a second requeue would start nothing: refused.
    r = await api.http.post(f"{PATH}/{event_id}/requeue", headers=api.as_admin())
    assert_problem(r, 409, "OUTBOX_NOT_REQUEUEABLE")


# ---- stuck -------------------------------------------------------------------------------


async def test_stuck_from_the_enqueue_event(api: Api, db: SessionMaker) -> None:
    waiting = await api.create_id(targetId="waiting")
    assert await stuck_of(api, waiting) is None  # pending, never tried: simply queued

    backing_off = await api.create_id(targetId="backing-off")
    await set_enqueue(
        db,
        backing_off,
        "attempt_count = 2, available_at = now() + interval '1 hour', last_error = 'timeout'",
    )
    stuck = await stuck_of(api, backing_off)
    assert stuck is not None and stuck["reason"] == "ENQUEUE_BACKING_OFF"
    assert "2 attempt" in stuck["detail"] and "timeout" in stuck["detail"]

    missing = await api.create_id(targetId="missing")
    await set_enqueue(db, missing, "status = 'published', published_at = now()")
    stuck = await stuck_of(api, missing)
    assert stuck is not None and stuck["reason"] == "WORKFLOW_MISSING", stuck
    assert stuck["since"] is not None

    # Only queued or running jobs can be stuck: a cancelled one with a dead enqueue is not.
    cancelled = await api.create_id(targetId="cancelled")
    assert (await api.cancel(cancelled)).status_code == 200
    await set_enqueue(db, cancelled, "status = 'dead', attempt_count = 3")
    assert await stuck_of(api, cancelled) is None


async def test_stuck_when_the_workflow_was_terminated_under_a_running_job(
    api: Api, workers: Stack, temporal_client: Client
) -> None:
    job = await api.create_id(input={"hang": True})
    await api.wait_status(job, "running")
    assert await stuck_of(api, job) is None  # running, workflow healthy
    wf = (await api.admin_get(job))["workflowId"]
    await temporal_client.get_workflow_handle(wf).terminate(reason="operator test")

    # Reported once the relay has marked the enqueue published (it marks a dispatched batch
    # with its next claim, or alone shortly after) and Temporal answers within the budget.
    stuck = await eventually(
        lambda: stuck_of(api, job), timeout=15, what="the terminated workflow reported"
    )
    assert (await api.get(job))["lifecycleStatus"] == "running"
    assert stuck["reason"] == "WORKFLOW_CLOSED", stuck
    assert "TERMINATED" in stuck["detail"] and "running" in stuck["detail"]
    since = datetime.fromisoformat(stuck["since"])
    assert abs((datetime.now(UTC) - since).total_seconds()) < 60


@workflow.defn(name="synthetic")
class BadDeploySynthetic:
    """Stands in for a broken deploy of the job's workflow: a plain exception in workflow code
    fails the workflow task, which Temporal retries forever."""

    @workflow.run
    async def run(self, inp: Any) -> None:
        raise RuntimeError("simulated bad deploy")


async def test_stuck_when_the_workflow_task_keeps_failing(
    api: Api, db: SessionMaker, temporal_client: Client
) -> None:
    job = await api.create_id()
    await set_enqueue(db, job, "status = 'published', published_at = now()")
    wf = (await api.admin_get(job))["workflowId"]
    queue = f"bad-deploy-{uuid.uuid4().hex[:10]}"
    async with Worker(
        temporal_client,
        task_queue=queue,
        workflows=[BadDeploySynthetic],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await temporal_client.start_workflow(
            "synthetic", {"jobId": job}, id=wf, task_queue=queue
        )
        try:
            stuck = await eventually(
                lambda: stuck_of(api, job), timeout=20, interval=0.2, what="the job to be stuck"
            )
            assert stuck["reason"] == "WORKFLOW_TASK_FAILING", stuck
            assert "attempt" in stuck["detail"] and stuck["since"] is None
            attempt = int(stuck["detail"].split("attempt ")[1].split(";")[0])
            assert attempt > 1
        finally:
            await handle.terminate(reason="test cleanup")


# ---- the classification, on constructed values -------------------------------------------
