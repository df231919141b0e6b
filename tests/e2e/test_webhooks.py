"""Signed webhooks end to end: the API registers receivers, a synthetic job runs through the
relay, and the deliverer POSTs to a real HTTP receiver (`http.server` on 127.0.0.1 in a thread).
Signatures are checked with the Standard Webhooks algorithm written out here from the spec."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client

from activities.webhooks import WebhookConfig, WebhookDeliverer
from db.outbox import CANCELLED, COMPLETED, FAILED
from db.session import SessionMaker
from engine.contracts import RECONCILER_SCHEDULE_ID
from engine.definition import SYSTEM_QUEUE
from jobs.credentials import credential_cipher
from jobs.webhooks import MAX_ENDPOINTS_PER_USER
from runtime.wiring import build_parts
from runtime.worker import run_workers
from tests.e2e.conftest import Api, assert_problem, start_api
from tests.stack import Stack
from tests.support import eventually
from tests.webhook_helpers import Received, assert_fresh, closed_port, receiver, verified_by

ALL_EVENTS = [COMPLETED, FAILED, CANCELLED]


# ---- fixtures ---------------------------------------------------------------------------------

TEST_CONFIG = WebhookConfig(
    allow_private=True,
    retry_base_s=0.3,
    retry_max_s=1.0,
    poll_interval_s=0.05,
    request_timeout_s=3.0,
    connect_timeout_s=1.0,
)


@pytest.fixture
async def deliverer(workers: Stack) -> AsyncIterator[WebhookDeliverer]:
    d = WebhookDeliverer(
        workers.parts.sessionmaker, credential_cipher(workers.settings), TEST_CONFIG
    )
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    yield d
    stop.set()
    await asyncio.wait_for(task, 15)


async def register(api: Api, url: str, user: str = "alice", **body: Any) -> dict[str, Any]:
    r = await api.http.post(
        "/api/ai/webhooks", json={"url": url, **body}, headers=api.as_user(user)
    )
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


async def deliveries(api: Api, status: str | None = None) -> list[dict[str, Any]]:
    params = {"status": status} if status else {}
    r = await api.http.get(
        "/admin-api/ai/webhook-deliveries", params=params, headers=api.as_admin()
    )
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


# ---- tests --------------------------------------------------------------------------------------


async def test_a_succeeded_job_is_delivered_once_signed(
    api: Api, workers: Stack, deliverer: WebhookDeliverer
) -> None:
    with receiver() as rec:
        hook = await register(api, rec.url)
        assert hook["eventTypes"] == ALL_EVENTS
        assert hook["secret"].startswith("whsec_")
        assert len(base64.b64decode(hook["secret"].removeprefix("whsec_"))) == 32
        job = await api.create_id(input={"echo": {"n": 1}})
        final = await api.wait_status(job)
        assert final["lifecycleStatus"] == "succeeded"
        [req] = await rec.wait_for(1)
        await asyncio.sleep(0.5)  # nothing else arrives
        assert len(rec.requests) == 1
    assert verified_by(hook["secret"], req)
    assert req.headers["webhook-id"].startswith("msg_")
    assert req.headers["content-type"] == "application/json"
    assert_fresh(req)
    body = json.loads(req.body)
    assert body["type"] == "ai.job.completed"
    assert isinstance(body["timestamp"], str)
    assert body["data"] == await api.get(job)  # the JobStatusResponse a GET returns
    [row] = await deliveries(api)
    assert row["status"] == "delivered" and row["attemptCount"] == 1
    assert row["messageId"] == req.headers["webhook-id"] and row["jobId"] == job
    # A tampered body does not verify.
    assert not verified_by(hook["secret"], Received(req.headers, req.body + b" ", req.at))


async def test_a_retry_keeps_its_webhook_id_and_an_admin_can_replay(
    api: Api, workers: Stack, deliverer: WebhookDeliverer
) -> None:
    with receiver(500) as rec:
        hook = await register(api, rec.url, eventTypes=["ai.job.completed"])
        job = await api.create_id()
        await api.wait_status(job, "succeeded")
        first, second = await rec.wait_for(2)
        assert first.headers["webhook-id"] == second.headers["webhook-id"]
        assert verified_by(hook["secret"], first) and verified_by(hook["secret"], second)
        assert first.body == second.body
        [row] = await eventually(
            lambda: deliveries(api, "delivered"), timeout=5, what="a delivered row"
        )
        assert row["attemptCount"] == 2 and row["lastStatusCode"] == 200
        assert await deliveries(api, "dead") == []

        r = await api.http.post(
            f"/admin-api/ai/webhook-deliveries/{row['id']}/replay", headers=api.as_admin()
        )
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "pending"
        third = (await rec.wait_for(3))[2]
        assert third.headers["webhook-id"] == first.headers["webhook-id"]
        assert verified_by(hook["secret"], third)
    r = await api.http.post(
        "/admin-api/ai/webhook-deliveries/999999/replay", headers=api.as_admin()
    )
    assert_problem(r, 404, "WEBHOOK_DELIVERY_NOT_FOUND")
    r = await api.http.get("/admin-api/ai/webhook-deliveries", headers=api.as_user())
    assert r.status_code == 403


async def test_a_failed_job_goes_only_to_endpoints_that_asked_for_failures(
    api: Api, workers: Stack, deliverer: WebhookDeliverer
) -> None:
    with receiver() as failures, receiver() as completions:
        hook = await register(api, failures.url, eventTypes=["ai.job.failed"])
        await register(api, completions.url, eventTypes=["ai.job.completed"])
        await register(api, completions.url, user="bob")  # someone else's job events
        job = await api.create_id(input={"failTimes": 100, "failCode": "CONTENT_SAFETY_BLOCKED"})
        final = await api.wait_status(job)
        assert final["lifecycleStatus"] == "failed"
        [req] = await failures.wait_for(1)
        await asyncio.sleep(0.5)  # nothing else arrives
        assert completions.requests == [] and len(failures.requests) == 1
    assert verified_by(hook["secret"], req)
    body = json.loads(req.body)
    assert body["type"] == "ai.job.failed"
    assert body["data"] == await api.get(job)
    assert body["data"]["errorCode"] == "CONTENT_SAFETY_BLOCKED"


async def test_a_cancelled_running_job_is_delivered(
    api: Api, workers: Stack, deliverer: WebhookDeliverer
) -> None:
    with receiver() as rec:
        hook = await register(api, rec.url)
        job = await api.create_id(input={"hang": True})
        await api.wait_status(job, "running")
        assert (await api.cancel(job)).status_code == 202
        assert (await api.wait_status(job))["lifecycleStatus"] == "cancelled"
        [req] = await rec.wait_for(1)
    assert verified_by(hook["secret"], req)
    body = json.loads(req.body)
    assert body["type"] == "ai.job.cancelled" and body["data"] == await api.get(job)


async def test_a_dead_or_hanging_receiver_delays_neither_others_nor_the_job(
    api: Api, workers: Stack, deliverer: WebhookDeliverer
) -> None:
    hanging = socket.socket()
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(16)  # accepts connections (backlog), never answers
    try:
        with receiver() as rec:
            await register(api, f"http://127.0.0.1:{closed_port()}/hook")
            await register(api, f"http://127.0.0.1:{hanging.getsockname()[1]}/hook")
            hook = await register(api, rec.url)
            started = time.monotonic()
            job = await api.create_id()
            final = await api.wait_status(job, timeout=15)
            assert final["lifecycleStatus"] == "succeeded"
            succeeded_at = time.time()
            assert time.monotonic() - started < 10
            [req] = await rec.wait_for(1, timeout=TEST_CONFIG.request_timeout_s)
            # Well inside the hanging receiver's time limit: it held only its own slot.
            assert req.at - succeeded_at < TEST_CONFIG.request_timeout_s / 2
            assert verified_by(hook["secret"], req)

            # The dead receiver is retried meanwhile, not delivered.
            async def retried() -> bool:
                return "failed" in {r["status"] for r in await deliveries(api)}

            await eventually(retried, timeout=5, what="a failed (to be retried) delivery")
            assert len(rec.requests) == 1
    finally:
        hanging.close()


async def test_rotation_signs_with_both_secrets_during_the_grace_period(
    api: Api, workers: Stack, deliverer: WebhookDeliverer
) -> None:
    with receiver() as rec:
        hook = await register(api, rec.url)
        r = await api.http.post(
            f"/api/ai/webhooks/{hook['webhookId']}/rotate", headers=api.as_user()
        )
        assert r.status_code == 200, r.text
        rotated = r.json()
        assert rotated["secret"] != hook["secret"] and rotated["secret"].startswith("whsec_")
        assert rotated["previousSecretValidUntil"]
        job = await api.create_id()
        await api.wait_status(job, "succeeded")
        [req] = await rec.wait_for(1)
    signatures = req.headers["webhook-signature"].split(" ")
    assert len(signatures) == 2 and all(s.startswith("v1,") for s in signatures)
    assert verified_by(hook["secret"], req) and verified_by(rotated["secret"], req)
    assert not verified_by("whsec_" + base64.b64encode(b"x" * 32).decode(), req)


async def test_secrets_are_never_listed_and_only_the_owner_may_delete(
    api: Api, db: SessionMaker
) -> None:
    hook = await register(api, "http://127.0.0.1:9/hook", eventTypes=["ai.job.failed"])
    r = await api.http.get("/api/ai/webhooks", headers=api.as_user())
    assert r.status_code == 200
    [item] = r.json()["items"]
    assert "secret" not in item and hook["secret"] not in r.text
    assert hook["secret"].removeprefix("whsec_") not in r.text
    assert item["eventTypes"] == ["ai.job.failed"]
    assert (await api.http.get("/api/ai/webhooks", headers=api.as_user("bob"))).json() == {
        "items": []
    }
    wid = hook["webhookId"]
    r = await api.http.delete(f"/api/ai/webhooks/{wid}", headers=api.as_user("bob"))
    assert_problem(r, 404, "WEBHOOK_NOT_FOUND")
    r = await api.http.post(f"/api/ai/webhooks/{wid}/rotate", headers=api.as_user("bob"))
    assert_problem(r, 404, "WEBHOOK_NOT_FOUND")
    r = await api.http.delete(f"/api/ai/webhooks/{wid}", headers=api.as_user())
    assert r.status_code == 204
    assert (await api.http.get("/api/ai/webhooks", headers=api.as_user())).json()["items"] == []
    r = await api.http.delete(f"/api/ai/webhooks/{wid}", headers=api.as_user())
    assert_problem(r, 404, "WEBHOOK_NOT_FOUND")
    # The secret is stored encrypted.
    async with db() as s:
        blob = (await s.execute(text("SELECT secret_ciphertext FROM webhook_endpoint"))).scalar()
    assert blob is not None and hook["secret"].encode() not in bytes(blob)


async def test_registration_validates_its_body(api: Api) -> None:
    for body in (
        {"url": "ftp://example.com/x"},
        {"url": "http://127.0.0.1/x", "eventTypes": ["ai.job.enqueue"]},
        {"url": "http://127.0.0.1/x", "eventTypes": []},
        {"url": "http://user:pw@127.0.0.1/x"},
        {"url": "not a url"},
    ):
        r = await api.http.post("/api/ai/webhooks", json=body, headers=api.as_user())
        assert_problem(r, 422, "VALIDATION_FAILED")


async def test_production_refuses_private_urls_and_needs_an_encryption_key(
    db: SessionMaker, env: Any
) -> None:
    settings = env(AIJOBS_ENV="production", JWT_SECRET="e2e-" + "s" * 40)
    async with start_api(settings) as prod:
        r = await prod.http.post(
            "/api/ai/webhooks", json={"url": "https://hooks.example.com/x"}, headers=prod.as_user()
        )
        assert_problem(r, 503, "CREDENTIAL_STORAGE_UNAVAILABLE")
    key = "k1:" + base64.b64encode(b"K" * 32).decode()
    settings = env(
        AIJOBS_ENV="production", JWT_SECRET="e2e-" + "s" * 40, CREDENTIAL_ENCRYPTION_KEY=key
    )
    async with start_api(settings) as prod:
        for url in ("http://127.0.0.1/x", "https://10.0.0.1/x", "https://[::1]/x"):
            r = await prod.http.post("/api/ai/webhooks", json={"url": url}, headers=prod.as_user())
            assert_problem(r, 422, "VALIDATION_FAILED")


async def test_the_ai_system_worker_runs_the_deliverer(
    api: Api, workers: Stack, temporal_client: Client
) -> None:
    """No deliverer of the test's own here: the `ai-system` worker process brings one."""
    settings = workers.settings
    parts = build_parts(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(run_workers(temporal_client, parts, [SYSTEM_QUEUE], stop))
    try:
        with receiver() as rec:
            hook = await register(api, rec.url)
            job = await api.create_id()
            await api.wait_status(job, "succeeded")
            [req] = await rec.wait_for(1)
        assert verified_by(hook["secret"], req)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await parts.close()
        suffix = settings.task_queue_suffix
        with contextlib.suppress(Exception):
            await temporal_client.get_schedule_handle(RECONCILER_SCHEDULE_ID + suffix).delete()
        with contextlib.suppress(Exception):  # the relay workflow the worker started
            await temporal_client.get_workflow_handle(f"outbox-relay-0{suffix}").terminate()


async def test_a_delivery_that_keeps_failing_ends_dead(api: Api, workers: Stack) -> None:
    config = WebhookConfig(
        allow_private=True, retry_base_s=0.1, retry_max_s=0.2, retry_for_s=1.0, poll_interval_s=0.05
    )
    d = WebhookDeliverer(workers.parts.sessionmaker, credential_cipher(workers.settings), config)
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    try:
        await register(api, f"http://127.0.0.1:{closed_port()}/hook")
        job = await api.create_id()
        await api.wait_status(job, "succeeded")
        [row] = await eventually(
            lambda: deliveries(api, "dead"), timeout=10, interval=0.1, what="a dead delivery"
        )
        assert row["attemptCount"] >= 3 and row["lastStatusCode"] is None
        assert row["lastError"] and len(row["lastError"]) <= 300
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_a_user_has_at_most_the_endpoint_cap(api: Api) -> None:
    cap = MAX_ENDPOINTS_PER_USER
    assert cap == 10  # the default
    hooks = [await register(api, f"http://127.0.0.1:9/hook/{i}") for i in range(cap)]
    r = await api.http.post(
        "/api/ai/webhooks", json={"url": "http://127.0.0.1:9/one-more"}, headers=api.as_user()
    )
    problem = assert_problem(r, 409, "WEBHOOK_LIMIT_REACHED")
    assert "secret" not in r.text and "127.0.0.1" not in problem.get("detail", "")
    # The cap is per user: someone else still registers.
    await register(api, "http://127.0.0.1:9/bob", user="bob")
    # Deleting one frees its place.
    r = await api.http.delete(f"/api/ai/webhooks/{hooks[0]['webhookId']}", headers=api.as_user())
    assert r.status_code == 204
    await register(api, "http://127.0.0.1:9/again")
    listed = (await api.http.get("/api/ai/webhooks", headers=api.as_user())).json()["items"]
    assert len(listed) == cap


async def test_concurrent_registrations_cannot_overshoot_the_cap(api: Api) -> None:
    cap = MAX_ENDPOINTS_PER_USER
    answers = await asyncio.gather(
        *(
            api.http.post(
                "/api/ai/webhooks",
                json={"url": f"http://127.0.0.1:9/race/{i}"},
                headers=api.as_user("racer"),
            )
            for i in range(cap + 5)
        )
    )
    assert sorted(r.status_code for r in answers) == [201] * cap + [409] * 5


async def test_the_endpoint_cap_is_in_the_openapi_document(api: Api) -> None:
    doc = (await api.http.get("/openapi.json")).json()
    answer = doc["paths"]["/api/ai/webhooks"]["post"]["responses"]["409"]
    assert "WEBHOOK_LIMIT_REACHED" in answer["description"]
    assert "application/problem+json" in answer["content"]
