"""The REST API of docs/api.md over real HTTP (uvicorn + httpx) on real PostgreSQL and Temporal:
status codes, problem+json bodies, idempotency, pagination, filters, admin views, retry, cancel,
quotas, health and OpenAPI."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from engine.errors import PUBLIC_MESSAGES
from jobs.spec import Catalog
from jobs.types import default_catalog, synthetic
from runtime.embedded import free_port
from runtime.wiring import api_app, create_policy
from tests.e2e.conftest import (
    JOB_STATUS_KEYS,
    PROBLEM,
    Api,
    assert_no_leak,
    assert_problem,
    serve,
    start_api,
)
from tests.stack import TERMINAL, Stack

SECRET = "s3cr3t-VALUE-6f1d"  # must never come back in an error body


async def ids_of(api: Api, path: str, headers: dict[str, str], **params: Any) -> list[str]:
    r = await api.http.get(path, headers=headers, params=params)
    assert r.status_code == 200, r.text
    return [item["jobId"] for item in r.json()["items"]]


async def walk_pages(
    api: Api,
    path: str,
    headers: dict[str, str],
    *,
    between_pages: Any = None,
    **params: Any,
) -> tuple[list[str], list[str]]:
    """Follows `nextCursor` to the end; returns (job ids in order, cursors seen)."""
    seen: list[str] = []
    cursors: list[str] = []
    cursor: str | None = None
    for _ in range(50):
        q = dict(params, **({"cursor": cursor} if cursor else {}))
        r = await api.http.get(path, headers=headers, params=q)
        assert r.status_code == 200, r.text
        page = r.json()
        assert set(page) == {"items", "nextCursor"}
        seen += [item["jobId"] for item in page["items"]]
        cursor = page["nextCursor"]
        if cursor is None:
            return seen, cursors
        cursors.append(cursor)
        if between_pages is not None:
            await between_pages()
    raise AssertionError("pagination did not end")


async def job_count(db: SessionMaker, table: str = "ai_job") -> int:
    async with db() as s:
        return int((await s.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one())


async def failed_job(api: Api) -> str:
    """A job that fails at once (a non-retryable code) and keeps an internal message."""
    job = await api.create_id(input={"failTimes": 5, "failCode": "CONTENT_SAFETY_BLOCKED"})
    final = await api.wait_status(job)
    assert final["lifecycleStatus"] == "failed", final
    return job


# ---- create --------------------------------------------------------------------------------


async def test_create_answers_202_with_location_and_the_frozen_job_shape(api: Api) -> None:
    r = await api.create(input={"echo": {"n": 1}}, priority=7)
    body = r.json()
    assert r.headers["content-type"] == "application/json"
    assert set(body) == JOB_STATUS_KEYS
    job_id = str(uuid.UUID(body["jobId"]))
    assert r.headers["location"] == f"/api/ai/jobs/{job_id}"
    assert body["jobType"] == "synthetic"
    assert body["lifecycleStatus"] == "queued"
    assert body["queueName"] == "ai-interactive"
    assert (body["priority"], body["progress"]) == (7, 0)
    assert body["startedAt"] is None and body["finishedAt"] is None and body["result"] is None
    assert body["errorCode"] is None and body["publicErrorMessage"] is None
    assert body["rolloutArm"] is None  # no rollout stands for the type

    followed = await api.http.get(r.headers["location"], headers=api.as_user())
    assert followed.status_code == 200
    assert followed.json() == body

    default = (await api.create()).json()
    assert default["priority"] == synthetic.DEFINITION.queue.default_priority


async def test_same_idempotency_key_and_body_returns_the_existing_job_with_200(
    api: Api, db: SessionMaker
) -> None:
    first = await api.create(key="order-42", input={"echo": {"a": 1, "b": [1, 2]}})
    # The same request with its JSON members in another order is the same request.
    again = await api.create(key="order-42", input={"echo": {"b": [1, 2], "a": 1}}, expect=200)
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    assert await job_count(db) == 1
    assert await job_count(db, "outbox_event") == 1


@pytest.mark.parametrize(
    "change",
    [
        {"targetId": "lesson-2"},
        {"targetType": "quiz"},
        {"input": {"echo": {"a": 2}}},
        {"priority": 9},
    ],
    ids=["targetId", "targetType", "input", "priority"],
)
async def test_same_idempotency_key_with_another_body_is_422(
    api: Api, db: SessionMaker, change: dict[str, Any]
) -> None:
    await api.create(key="order-43", input={"echo": {"a": 1}})
    body = {"input": {"echo": {"a": 1}}, **change}
    r = await api.create(key="order-43", expect=None, **body)
    assert_problem(r, 422, "IDEMPOTENCY_KEY_REUSED")
    assert await job_count(db) == 1


async def test_idempotency_keys_belong_to_one_user(api: Api) -> None:
    alice = (await api.create("alice", key="shared-key")).json()
    bob = (await api.create("bob", key="shared-key")).json()  # a new job, not alice's
    assert bob["jobId"] != alice["jobId"]
    replay = await api.create("bob", key="shared-key", expect=200)
    assert replay.json()["jobId"] == bob["jobId"]


@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "clé".encode()], ids=repr)
async def test_malformed_idempotency_key_is_422(api: Api, db: SessionMaker, key: Any) -> None:
    headers = {**api.as_user(), "Idempotency-Key": key}
    body = {"jobType": "synthetic", "targetType": "t", "targetId": "1", "input": {}}
    r = await api.http.post("/api/ai/jobs", json=body, headers=headers)
    assert_problem(r, 422, "VALIDATION_FAILED")
    assert await job_count(db) == 0


@pytest.mark.parametrize("quotas", [False, True], ids=["no-quota", "quota-lock"])
async def test_twenty_concurrent_creates_with_one_key_make_one_job(
    api: Api, db: SessionMaker, env: Any, quotas: bool
) -> None:
    """Both create paths race: the unique-violation fallback (no quotas) and the per-user
    advisory lock of the quota check."""

    async def burst(target: Api) -> list[httpx.Response]:
        return list(
            await asyncio.gather(
                *(
                    target.create(key="burst", input={"echo": {"n": 1}}, expect=None)
                    for _ in range(20)
                )
            )
        )

    if quotas:
        async with start_api(env(QUOTA_MAX_ACTIVE_JOBS=5, QUOTA_MAX_JOBS_PER_DAY=5)) as q:
            responses = await burst(q)
    else:
        responses = await burst(api)
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 19 + [202], [r.text for r in responses if r.status_code >= 300]
    assert len({r.json()["jobId"] for r in responses}) == 1
    assert await job_count(db) == 1
    assert await job_count(db, "outbox_event") == 1


async def test_unknown_job_type_is_422(api: Api, db: SessionMaker) -> None:
    r = await api.create(jobType="no_such_type", expect=None)
    assert_problem(r, 422, "VALIDATION_FAILED")
    assert await job_count(db) == 0


async def test_invalid_synthetic_input_lists_errors_without_echoing_values(api: Api) -> None:
    bad = {
        "delayMs": SECRET,
        "failTimes": -1,
        "failCode": SECRET.lower(),
        "hang": {"nested": SECRET},
        "mystery": SECRET,
    }
    r = await api.create(input=bad, expect=None)
    body = assert_problem(r, 422, "VALIDATION_FAILED")
    assert isinstance(body["errors"], list) and body["errors"]
    for e in body["errors"]:
        assert set(e) == {"loc", "msg", "type"}, e
    # Located from the request's root, as the body's own fields are (docs/api.md, "Errors").
    assert {tuple(e["loc"]) for e in body["errors"]} == {
        ("body", "input", "delayMs"),
        ("body", "input", "failTimes"),
        ("body", "input", "failCode"),
        ("body", "input", "hang"),
        ("body", "input", "mystery"),
    }
    assert SECRET not in r.text and SECRET.lower() not in r.text


@pytest.mark.parametrize(
    "payload",
    [
        {"targetType": "t", "targetId": "1"},  # no jobType
        {"jobType": "synthetic", "targetType": "t", "targetId": {"k": SECRET}},
        {"jobType": "synthetic", "targetType": "t", "targetId": "1", "extra": SECRET},
        {"jobType": "synthetic", "targetType": "t", "targetId": "1", "priority": 101},
        {"jobType": "synthetic", "targetType": "t", "targetId": "1", "input": [SECRET]},
        {"jobType": "synthetic", "targetType": "t", "targetId": "1", "credentialMode": SECRET},
        {"jobType": "synthetic", "targetType": "", "targetId": "1"},
        [SECRET],
    ],
    ids=["missing", "wrong-type", "extra", "priority", "input-list", "mode", "empty", "array"],
)
async def test_malformed_create_body_is_422_without_echo(api: Api, payload: Any) -> None:
    r = await api.http.post("/api/ai/jobs", json=payload, headers=api.as_user())
    body = assert_problem(r, 422, "VALIDATION_FAILED")
    assert body["errors"]
    assert SECRET not in r.text


async def test_body_that_is_not_json_is_a_4xx_problem_without_echo(api: Api) -> None:
    headers = {**api.as_user(), "content-type": "application/json"}
    for raw in (b'{"jobType": "' + SECRET.encode(), b"\xff\xfe" + SECRET.encode()):
        r = await api.http.post("/api/ai/jobs", content=raw, headers=headers)
        assert r.status_code in (400, 422), r.text
        assert r.headers["content-type"] == PROBLEM
        assert SECRET not in r.text


# JSON that parses but that PostgreSQL cannot store (NUL, unpaired surrogates) or that is nested
# beyond what the serializer handles used to surface as 500 from deep inside the create path.
_NESTED = '{"a":' * 300 + "1" + "}" * 300


@pytest.mark.parametrize(
    "raw",
    [
        r'{"jobType":"synthetic","targetType":"t","targetId":"a\u0000b","input":{}}',
        r'{"jobType":"synthetic","targetType":"t","targetId":"a","input":{"echo":{"k":"\u0000"}}}',
        r'{"jobType":"synthetic","targetType":"t","targetId":"a","input":{"echo":{"\u0000":1}}}',
        r'{"jobType":"synthetic","targetType":"t","targetId":"a","input":{"echo":{"k":"\ud800"}}}',
        '{"jobType":"synthetic","targetType":"t","targetId":"a","input":{"echo":' + _NESTED + "}}",
    ],
    ids=["nul-target", "nul-value", "nul-key", "lone-surrogate", "nested-300"],
)
async def test_unstorable_json_is_422_not_500(api: Api, db: SessionMaker, raw: str) -> None:
    headers = {**api.as_user(), "content-type": "application/json"}
    r = await api.http.post("/api/ai/jobs", content=raw.encode(), headers=headers)
    assert_problem(r, 422, "VALIDATION_FAILED")
    assert await job_count(db) == 0


async def test_nan_in_input_is_rejected_not_rewritten(api: Api, db: SessionMaker) -> None:
    raw = b'{"jobType":"synthetic","targetType":"t","targetId":"a","input":{"echo":{"k":NaN}}}'
    headers = {**api.as_user(), "content-type": "application/json"}
    r = await api.http.post("/api/ai/jobs", content=raw, headers=headers)
    assert_problem(r, 422, "VALIDATION_FAILED")
    async with db() as s:
        assert (await s.execute(text("SELECT count(*) FROM ai_job"))).scalar_one() == 0


# ---- get and list ----------------------------------------------------------------------------


async def test_get_with_a_malformed_job_id_is_422(api: Api) -> None:
    for path in ("/api/ai/jobs/not-a-uuid", "/admin-api/ai/jobs/12345"):
        r = await api.http.get(path, headers=api.as_admin())
        assert_problem(r, 422, "VALIDATION_FAILED")


async def test_list_is_own_jobs_newest_first_filtered_by_status_and_job_type(api: Api) -> None:
    mine = [await api.create_id("alice", targetId=f"t{i}") for i in range(3)]
    theirs = await api.create_id("bob")
    assert (await api.cancel(mine[0])).status_code == 200
    h = api.as_user("alice")
    path = "/api/ai/jobs"
    assert await ids_of(api, path, h) == mine[::-1]
    assert theirs not in await ids_of(api, path, h, limit=100)
    assert await ids_of(api, path, h, status="cancelled") == [mine[0]]
    assert await ids_of(api, path, h, status="queued") == [mine[2], mine[1]]
    assert await ids_of(api, path, h, status="succeeded") == []
    assert await ids_of(api, path, h, jobType="synthetic") == mine[::-1]
    assert await ids_of(api, path, h, jobType="quiz_generation") == []
    assert await ids_of(api, path, h, jobType="synthetic", status="queued") == [mine[2], mine[1]]


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/ai/jobs", {"status": "done"}),
        ("/api/ai/jobs", {"status": "QUEUED"}),
        ("/api/ai/jobs", {"jobType": "Not-A-Type"}),
        ("/api/ai/jobs", {"jobType": "a\x00b"}),
        ("/api/ai/jobs", {"limit": "0"}),
        ("/api/ai/jobs", {"limit": "101"}),
        ("/api/ai/jobs", {"limit": "ten"}),
        ("/api/ai/jobs", {"cursor": "not-a-cursor"}),
        ("/api/ai/jobs", {"cursor": "x" * 201}),
        ("/admin-api/ai/jobs", {"status": "pending"}),
        ("/admin-api/ai/jobs", {"queueName": "ai-system"}),
        ("/admin-api/ai/jobs", {"jobType": "x" * 65}),
        ("/admin-api/ai/jobs", {"userId": "a\x00b"}),
        ("/admin-api/ai/jobs", {"userId": "u" * 129}),
        ("/admin-api/ai/jobs", {"createdFrom": "yesterday"}),
        ("/admin-api/ai/jobs", {"createdTo": "2024-13-01"}),
        ("/admin-api/ai/jobs", {"cursor": "MjAyMC0wMS0wMXwx"}),  # base64 of garbage
    ],
)
async def test_bad_filters_are_422_not_500(api: Api, path: str, params: dict[str, str]) -> None:
    r = await api.http.get(path, headers=api.as_admin(), params=params)
    assert_problem(r, 422, "VALIDATION_FAILED")


async def test_cursor_pagination_is_opaque_and_stable_under_inserts(api: Api) -> None:
    originals = [await api.create_id(targetId=f"t{i}") for i in range(7)]
    inserted: list[str] = []

    async def insert_two() -> None:
        inserted.extend([await api.create_id(targetId="late"), await api.create_id()])

    seen, cursors = await walk_pages(
        api, "/api/ai/jobs", api.as_user(), between_pages=insert_two, limit=3
    )
    # Jobs created while paging are newer than the cursor: no duplicates, no gaps.
    assert seen == originals[::-1]
    assert len(cursors) == 2 and len(inserted) == 4
    for c in cursors:
        assert isinstance(c, str) and not any(j in c for j in originals)
    first = await ids_of(api, "/api/ai/jobs", api.as_user(), limit=4)
    assert first == inserted[::-1]
    # A page that ends exactly at the last job has no next cursor.
    seen, cursors = await walk_pages(api, "/api/ai/jobs", api.as_user(), limit=11)
    assert len(seen) == 11 and cursors == []


# ---- admin -----------------------------------------------------------------------------------


async def test_admin_list_filters(api: Api) -> None:
    a1 = (await api.create("alice")).json()
    a2 = (await api.create("alice")).json()
    b1 = (await api.create("bob")).json()
    assert (await api.cancel(a1["jobId"], "alice")).status_code == 200
    i1, i2, ib = a1["jobId"], a2["jobId"], b1["jobId"]
    h = api.as_admin()
    path = "/admin-api/ai/jobs"
    assert await ids_of(api, path, h) == [ib, i2, i1]
    assert await ids_of(api, path, h, userId="alice") == [i2, i1]
    assert await ids_of(api, path, h, userId="bob") == [ib]
    assert await ids_of(api, path, h, userId="nobody") == []
    assert await ids_of(api, path, h, status="cancelled") == [i1]
    assert await ids_of(api, path, h, status="queued") == [ib, i2]
    assert await ids_of(api, path, h, jobType="synthetic") == [ib, i2, i1]
    assert await ids_of(api, path, h, jobType="flashcard_generation") == []
    assert await ids_of(api, path, h, queueName="ai-interactive") == [ib, i2, i1]
    assert await ids_of(api, path, h, queueName="ai-background") == []
    # createdFrom is inclusive, createdTo exclusive.
    assert await ids_of(api, path, h, createdFrom=a2["createdAt"]) == [ib, i2]
    assert await ids_of(api, path, h, createdTo=a2["createdAt"]) == [i1]
    assert await ids_of(api, path, h, createdFrom=a2["createdAt"], createdTo=b1["createdAt"]) == [
        i2
    ]
    assert await ids_of(api, path, h, userId="alice", status="queued") == [i2]

    items = (await api.http.get(path, headers=h, params={"userId": "bob"})).json()["items"]
    assert items[0]["userId"] == "bob"
    assert items[0]["workflowId"] == f"ai-interactive:synthetic:{ib}"

    # Admin pagination follows the same opaque cursor, with filters kept.
    more = [await api.create_id("carol") for _ in range(4)]
    seen, cursors = await walk_pages(api, path, h, userId="carol", limit=2)
    assert seen == more[::-1] and len(cursors) == 1


async def test_admin_view_shows_internals_and_a_temporal_link(
    api: Api, workers: Stack, temporal_client: Client
) -> None:
    job = await failed_job(api)
    public = await api.get(job)
    assert public["errorCode"] == "CONTENT_SAFETY_BLOCKED"
    assert public["publicErrorMessage"] == PUBLIC_MESSAGES["CONTENT_SAFETY_BLOCKED"]
    assert "internalErrorMessage" not in public and "workflowId" not in public

    admin = await api.admin_get(job)
    assert JOB_STATUS_KEYS <= set(admin)
    assert admin["lifecycleStatus"] == "failed"
    assert admin["userId"] == "alice"
    assert (admin["targetType"], admin["targetId"]) == ("lesson", "lesson-1")
    assert admin["internalErrorMessage"] and "synthetic failure" in admin["internalErrorMessage"]
    assert admin["internalErrorMessage"] not in json.dumps(public)
    workflow_id = f"ai-interactive:synthetic:{job}"
    assert admin["workflowId"] == workflow_id
    ui = api.settings.temporal_ui_url.rstrip("/")
    assert admin["temporalUiUrl"] == (
        f"{ui}/namespaces/default/workflows/{quote(workflow_id, safe='')}"
    )
    assert admin["attemptCount"] >= 1 and admin["retriedFromJobId"] is None
    # The link names an execution that Temporal really has.
    desc = await temporal_client.get_workflow_handle(workflow_id).describe()
    assert desc.id == workflow_id and desc.workflow_type == "synthetic"

    r = await api.http.get(f"/admin-api/ai/jobs/{uuid.uuid4()}", headers=api.as_admin())
    assert_problem(r, 404, "JOB_NOT_FOUND")


async def test_admin_retry_of_a_failed_job_creates_a_linked_job(
    api: Api, workers: Stack, db: SessionMaker
) -> None:
    old = await failed_job(api)
    r = await api.http.post(f"/admin-api/ai/jobs/{old}/retry", headers=api.as_admin())
    assert r.status_code == 201, r.text
    body = r.json()
    new = body["jobId"]
    assert new != old
    assert set(body) == JOB_STATUS_KEYS | {"retriedFromJobId"}
    assert body["retriedFromJobId"] == old
    assert body["lifecycleStatus"] == "queued"
    assert r.headers["location"] == f"/admin-api/ai/jobs/{new}"

    view = await api.admin_get(new)
    assert view["retriedFromJobId"] == old
    assert (view["userId"], view["targetType"], view["targetId"]) == ("alice", "lesson", "lesson-1")
    assert (await api.get(new, "alice"))["jobId"] == new  # still the owner's job
    async with db() as s:
        rows = (await s.execute(text("SELECT id::text, input FROM ai_job"))).all()
    inputs = {str(r[0]): r[1] for r in rows}
    assert inputs[new] == inputs[old]

    # One retry per original: a double click answers the same new job.
    again = await api.http.post(f"/admin-api/ai/jobs/{old}/retry", headers=api.as_admin())
    assert again.status_code == 200 and again.json()["jobId"] == new
    assert await job_count(db) == 2


async def test_admin_retry_of_a_cancelled_job_and_409_for_others(api: Api) -> None:
    cancelled = await api.create_id()
    assert (await api.cancel(cancelled)).status_code == 200
    r = await api.http.post(f"/admin-api/ai/jobs/{cancelled}/retry", headers=api.as_admin())
    assert r.status_code == 201 and r.json()["retriedFromJobId"] == cancelled

    queued = await api.create_id()
    r = await api.http.post(f"/admin-api/ai/jobs/{queued}/retry", headers=api.as_admin())
    assert_problem(r, 409, "JOB_NOT_RETRYABLE")
    r = await api.http.post(f"/admin-api/ai/jobs/{uuid.uuid4()}/retry", headers=api.as_admin())
    assert_problem(r, 404, "JOB_NOT_FOUND")


# ---- cancel ----------------------------------------------------------------------------------


async def test_cancel_queued_job_then_again(api: Api) -> None:
    job = await api.create_id()
    r = await api.cancel(job)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == JOB_STATUS_KEYS | {"cancelOutcome"}
    assert body["cancelOutcome"] == "cancelled"
    assert body["lifecycleStatus"] == "cancelled"
    assert (await api.get(job))["lifecycleStatus"] == "cancelled"
    assert_problem(await api.cancel(job), 409, "JOB_ALREADY_CANCELLED")


async def test_cancel_running_job_is_202_then_it_ends_cancelled(api: Api, workers: Stack) -> None:
    job = await api.create_id(input={"hang": True})
    await api.wait_status(job, "running", *TERMINAL)
    assert (await api.get(job))["lifecycleStatus"] == "running"
    r = await api.http.post(f"/admin-api/ai/jobs/{job}/retry", headers=api.as_admin())
    assert_problem(r, 409, "JOB_NOT_RETRYABLE")

    r = await api.cancel(job)
    assert r.status_code == 202, r.text
    assert r.json()["cancelOutcome"] == "cancel_requested"
    assert r.json()["lifecycleStatus"] == "running"
    final = await api.wait_status(job, *TERMINAL)
    assert final["lifecycleStatus"] == "cancelled", final
    assert final["finishedAt"] is not None
    assert (await api.admin_get(job))["cancelRequestedAt"] is not None
    assert_problem(await api.cancel(job), 409, "JOB_ALREADY_CANCELLED")


async def test_succeeded_job_has_a_result_and_cannot_be_cancelled_or_retried(
    api: Api, workers: Stack
) -> None:
    job = await api.create_id(input={"echo": {"n": 1}})
    final = await api.wait_status(job)
    assert final["lifecycleStatus"] == "succeeded", final
    assert final["progress"] == 100 and final["startedAt"] and final["finishedAt"]
    assert final["result"]["artifactCount"] == 1
    assert [a["artifactType"] for a in final["result"]["artifacts"]] == ["synthetic_result"]
    assert_problem(await api.cancel(job), 409, "JOB_NOT_CANCELLABLE")
    r = await api.http.post(f"/admin-api/ai/jobs/{job}/retry", headers=api.as_admin())
    assert_problem(r, 409, "JOB_NOT_RETRYABLE")


# ---- quotas and platform -----------------------------------------------------------------------


async def test_quotas_answer_429_too_many_jobs_then_quota_exceeded(
    db: SessionMaker, env: Any
) -> None:
    async with start_api(env(QUOTA_MAX_ACTIVE_JOBS=2, QUOTA_MAX_JOBS_PER_DAY=3)) as q:
        j1 = await q.create_id()
        await q.create(key="second")
        r = await q.create(expect=None)
        assert_problem(r, 429, "TOO_MANY_JOBS")
        assert r.headers["retry-after"] == "5"  # a slot frees when a job ends: ask again soon
        # A replay of an existing key is answered with its job, not refused.
        await q.create(key="second", expect=200)
        await q.create("bob")  # quotas are per user

        assert (await q.cancel(j1)).status_code == 200  # one active slot free again
        j3 = await q.create_id()
        assert (await q.cancel(j3)).status_code == 200
        r = await q.create(expect=None)  # 1 active, but 3 created today
        assert_problem(r, 429, "QUOTA_EXCEEDED")
        assert 1 <= int(r.headers["retry-after"]) <= 86_400
        async with db() as s:
            n = await s.execute(text("SELECT count(*) FROM ai_job WHERE user_id = 'alice'"))
            assert n.scalar_one() == 3


async def test_platform_without_a_key_answers_503(db: SessionMaker, env: Any) -> None:
    """PLATFORM_UNAVAILABLE: a provider-backed job type while no platform credential exists."""
    provider_backed = dataclasses.replace(
        synthetic.JOB,
        definition=synthetic.DEFINITION.model_copy(
            update={"job_type": "provider_probe", "visibility": "public"}
        ),
        always_synthetic=False,
    )
    settings = env()
    policy = dataclasses.replace(create_policy(settings), platform_key_available=False)
    catalog = Catalog([synthetic.JOB, provider_backed])
    async with start_api(settings, policy=policy, catalog=catalog) as p:
        r = await p.create(jobType="provider_probe", expect=None)
        assert_problem(r, 503, "PLATFORM_UNAVAILABLE")
        await p.create()  # synthetic never needs the platform key


# ---- health ----------------------------------------------------------------------------------


async def test_healthz_and_readyz_when_everything_is_up(api: Api) -> None:
    r = await api.http.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    r = await api.http.get("/readyz")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "ready", "checks": {"postgres": "ok", "temporal": "ok"}}


async def test_readyz_is_503_when_temporal_is_unreachable(db: SessionMaker, env: Any) -> None:
    closed = free_port()
    async with start_api(env(TEMPORAL_ADDRESS=f"127.0.0.1:{closed}")) as down:
        assert (await down.http.get("/healthz")).status_code == 200
        r = await down.http.get("/readyz")
        assert r.status_code == 503, r.text
        assert r.json() == {
            "status": "unavailable",
            "checks": {"postgres": "ok", "temporal": "unavailable"},
        }
        assert str(closed) not in r.text
        # Create never talks to Temporal (outbox): it still works.
        await down.create()


async def test_database_down_is_503_without_hosts(env: Any) -> None:
    closed = free_port()
    url = f"postgresql://aijobs:pw@127.0.0.1:{closed}/nowhere"
    async with start_api(env(DATABASE_URL=url)) as down:
        r = await down.http.get("/readyz")
        assert r.status_code == 503
        assert r.json()["checks"]["postgres"] == "unavailable"
        r = await down.create(expect=None)
        assert_problem(r, 503, "SERVICE_UNAVAILABLE")
        assert r.headers["retry-after"]
        assert str(closed) not in r.text and "nowhere" not in r.text


async def test_unexpected_error_is_a_generic_500(env: Any) -> None:
    settings = env()
    app: FastAPI = api_app(settings)

    async def boom() -> None:
        raise RuntimeError("SELECT password FROM users -- db.internal:5432 /work/secret.py")

    app.add_api_route("/boom", boom)
    async with serve(app) as base, httpx.AsyncClient(base_url=base) as http:
        r = await http.get("/boom")
    body = assert_problem(r, 500, "INTERNAL_ERROR")
    assert "password" not in r.text and "db.internal" not in r.text
    assert body["detail"] == "An internal error occurred."


async def test_unknown_route_and_method_are_problems(api: Api) -> None:
    assert_problem(await api.http.get("/api/ai/nothing-here"), 404, "NOT_FOUND")
    r = await api.http.put(f"/api/ai/jobs/{uuid.uuid4()}", headers=api.as_user())
    assert_problem(r, 405, "METHOD_NOT_ALLOWED")


# ---- OpenAPI ---------------------------------------------------------------------------------


async def test_openapi_shows_every_public_input_schema(api: Api) -> None:
    r = await api.http.get("/openapi.json")
    assert r.status_code == 200
    spec = r.json()
    comps = spec["components"]["schemas"]
    policy = create_policy(api.settings)
    public = [
        jt
        for jt in default_catalog()
        if jt.definition.visibility == "public"
        or (jt.definition.visibility == "dev" and policy.synthetic_public)
    ]
    assert "synthetic" in [jt.job_type for jt in public]
    assert spec["x-job-types"] == [jt.job_type for jt in public]
    one_of = comps["CreateJobBody"]["properties"]["input"]["oneOf"]
    for jt in public:
        name = jt.input_model.__name__
        assert {"$ref": f"#/components/schemas/{name}"} in one_of
        expected = jt.input_model.model_json_schema(by_alias=True)["properties"]
        assert set(comps[name]["properties"]) == set(expected)
    assert set(comps["SyntheticInput"]["properties"]) == {
        "delayMs",
        "failTimes",
        "failCode",
        "hang",
        "invalidOutput",
        "echo",
    }
    paths = spec["paths"]
    for method, path in [
        ("post", "/api/ai/jobs"),
        ("get", "/api/ai/jobs"),
        ("get", "/api/ai/jobs/{jobId}"),
        ("post", "/api/ai/jobs/{jobId}/cancel"),
        ("get", "/admin-api/ai/jobs"),
        ("get", "/admin-api/ai/jobs/{jobId}"),
        ("post", "/admin-api/ai/jobs/{jobId}/retry"),
        ("get", "/healthz"),
        ("get", "/readyz"),
    ]:
        assert method in paths[path], (method, path)
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"

    docs = await api.http.get("/docs")
    assert docs.status_code == 200 and docs.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in docs.text and "swagger" in docs.text.lower()


async def test_production_hides_synthetic(db: SessionMaker, env: Any) -> None:
    async with start_api(env(AIJOBS_ENV="production", JWT_SECRET="e2e-" + "s" * 40)) as prod:
        spec = await prod.http.get("/openapi.json")
        assert spec.status_code == 200
        assert "synthetic" not in spec.text.lower()
        public = [jt.job_type for jt in default_catalog() if jt.definition.visibility == "public"]
        assert spec.json()["x-job-types"] == public
        hidden = await prod.create(expect=None)
        unknown = await prod.create(jobType="no_such_type", expect=None)
        assert_problem(hidden, 422, "VALIDATION_FAILED")
        # Indistinguishable from a type that does not exist.
        assert hidden.json() == unknown.json()
        assert_no_leak(hidden.text)
