"""Jobs join the client's product, over real HTTP (docs/api.md): `targetType`, `targetId` and the
client's own `metadata` on every view and as list filters; pinned prompt and output schema
versions; a delayed job (`runAt`) that waits queued in the outbox (its workflow starts at its
time), starts on time and is cancelled at once before it; and the owner's own retry."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client
from temporalio.service import RPCError

from db.session import SessionMaker
from tests.e2e.conftest import Api, assert_problem, start_api
from tests.stack import Stack


def locs(body: dict[str, Any]) -> list[list[str]]:
    return [e["loc"] for e in body.get("errors", [])]


async def listed(api: Api, user: str = "alice", **params: Any) -> list[str]:
    r = await api.http.get("/api/ai/jobs", params=params, headers=api.as_user(user))
    assert r.status_code == 200, r.text
    return [j["jobId"] for j in r.json()["items"]]


def rfc3339(at: datetime) -> str:
    return at.isoformat()


# ---- target and metadata ---------------------------------------------------------------------


async def test_target_and_metadata_round_trip_and_filter_the_list(api: Api) -> None:
    meta = {"courseId": "C42", "term": "autumn", "a.b-c_d": ""}
    r = await api.create(targetType="lesson", targetId="L1", metadata=meta)
    one = r.json()
    assert (one["targetType"], one["targetId"], one["metadata"]) == ("lesson", "L1", meta)
    assert one["runAt"] is None
    assert (await api.get(one["jobId"])) == one
    course = {"courseId": "C42"}
    two = (await api.create(targetType="lesson", targetId="L2", metadata=course)).json()
    three = (await api.create(targetType="quiz", targetId="L1")).json()
    assert three["metadata"] == {}
    bobs = await api.create_id("bob", targetType="lesson", targetId="L1", metadata=meta)

    page = (await api.http.get("/api/ai/jobs", headers=api.as_user())).json()["items"]
    assert {j["jobId"]: j["metadata"] for j in page}[one["jobId"]] == meta
    assert await listed(api, targetType="lesson") == [two["jobId"], one["jobId"]]
    assert await listed(api, targetId="L1") == [three["jobId"], one["jobId"]]
    assert await listed(api, targetType="lesson", targetId="L1") == [one["jobId"]]
    assert await listed(api, **{"metadata.courseId": "C42"}) == [two["jobId"], one["jobId"]]
    both = {"metadata.courseId": "C42", "metadata.term": "autumn"}
    assert await listed(api, **both) == [one["jobId"]]
    assert await listed(api, **{"metadata.a.b-c_d": ""}) == [one["jobId"]]
    assert await listed(api, **{"metadata.courseId": "C4"}) == []
    assert await listed(api, "bob", **both) == [bobs]
    # The same key twice: a job would have to hold both values.
    spring = await api.create_id(targetType="unit", targetId="U1", metadata={"term": "spring"})
    assert await listed(api, **{"metadata.term": "spring"}) == [spring]
    r = await api.http.get(
        "/api/ai/jobs?metadata.term=autumn&metadata.term=spring", headers=api.as_user()
    )
    assert r.status_code == 200 and r.json()["items"] == [], r.text

    # A filter no job could match is a mistake, located at its parameter.
    for name, value in (("metadata.bad key", "x"), ("metadata.", "x"), ("metadata.k", "v" * 513)):
        r = await api.http.get("/api/ai/jobs", params={name: value}, headers=api.as_user())
        assert locs(assert_problem(r, 422, "VALIDATION_FAILED")) == [["query", name]], name
    # The prefix is this route's only: elsewhere it is an unknown parameter.
    r = await api.http.get(
        f"/api/ai/jobs/{one['jobId']}", params={"metadata.courseId": "C42"}, headers=api.as_user()
    )
    assert locs(assert_problem(r, 422, "VALIDATION_FAILED")) == [["query", "metadata.courseId"]]


@pytest.mark.parametrize(
    ("metadata", "loc"),
    [
        ({f"k{i}": "v" for i in range(17)}, ["body", "metadata"]),
        ({"bad key": "v"}, ["body", "metadata", "bad key", "[key]"]),
        ({"k" * 65: "v"}, ["body", "metadata", "k" * 65, "[key]"]),
        ({"k": "v" * 513}, ["body", "metadata", "k"]),
        ({"k": 1}, ["body", "metadata", "k"]),
        ({"k": {"nested": "v"}}, ["body", "metadata", "k"]),
        ({"k": "a\u0000b"}, ["body", "metadata", "k"]),
    ],
    ids=["17-keys", "key-chars", "key-length", "value-length", "number", "object", "nul"],
)
async def test_metadata_mistakes_are_located(api: Api, metadata: Any, loc: list[str]) -> None:
    r = await api.create(metadata=metadata, expect=None)
    assert locs(assert_problem(r, 422, "VALIDATION_FAILED")) == [loc]


async def test_metadata_is_part_of_the_idempotency_fingerprint(api: Api) -> None:
    first = await api.create(key="k-meta", metadata={"courseId": "C42"})
    again = await api.create(key="k-meta", metadata={"courseId": "C42"}, expect=200)
    assert again.json()["jobId"] == first.json()["jobId"]
    other = await api.create(key="k-meta", metadata={"courseId": "C43"}, expect=None)
    assert_problem(other, 422, "IDEMPOTENCY_KEY_REUSED")
    none = await api.create(key="k-meta", expect=None)
    assert_problem(none, 422, "IDEMPOTENCY_KEY_REUSED")
    # No metadata and empty metadata are the same request.
    plain = await api.create(key="k-plain")
    same = await api.create(key="k-plain", metadata={}, expect=200)
    assert same.json()["jobId"] == plain.json()["jobId"]


# ---- pinned versions -------------------------------------------------------------------------


async def test_pinned_versions_are_checked_and_shown(api: Api) -> None:
    types = (await api.http.get("/api/ai/job-types", headers=api.as_user())).json()["items"]
    synthetic = next(t for t in types if t["name"] == "synthetic")
    pins = {
        "promptVersion": synthetic["promptVersion"],
        "outputSchemaVersion": synthetic["outputSchemaVersion"],
    }
    job = (await api.create(**pins)).json()
    assert (job["promptVersion"], job["outputSchemaVersion"]) == tuple(pins.values())
    assert (await api.get(job["jobId"]))["promptVersion"] == pins["promptVersion"]
    unpinned = (await api.create()).json()
    assert unpinned["promptVersion"] == pins["promptVersion"]

    for field in pins:
        r = await api.create(**{**pins, field: "no-such-version"}, expect=None)
        body = assert_problem(r, 422, "VALIDATION_FAILED")
        assert locs(body) == [["body", field]] and field in body["detail"], body
    r = await api.http.post(
        "/api/ai/jobs/quote",
        json={"jobType": "synthetic", "targetType": "t", "targetId": "1", "promptVersion": "x"},
        headers=api.as_user(),
    )
    assert locs(assert_problem(r, 422, "VALIDATION_FAILED")) == [["body", "promptVersion"]]
    # Any published version may be pinned, not only the default: a `.v1` of a type now at `.v2`.
    cards = next(t for t in types if t["name"] == "flashcard_generation")
    oldest = cards["promptVersions"][0]
    assert oldest != cards["promptVersion"]
    old = (
        await api.create(
            jobType="flashcard_generation",
            input={"sourceText": "Cells divide.", "count": 1},
            promptVersion=oldest,
        )
    ).json()
    assert old["promptVersion"] == oldest
    assert (await api.get(old["jobId"]))["promptVersion"] == oldest
    # A pin is part of the request: the same key with another pin is another request.
    await api.create(key="k-pin", **pins)
    r = await api.create(key="k-pin", expect=None)
    assert_problem(r, 422, "IDEMPOTENCY_KEY_REUSED")


# ---- runAt -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run_at",
    [
        "past",
        "too-far",
        "2030-01-01T00:00:00",  # no offset
        1893456000,  # a Unix time is not RFC 3339
        "tomorrow",
    ],
)
async def test_run_at_mistakes_are_refused(api: Api, run_at: Any) -> None:
    now = datetime.now(UTC)
    value = {
        "past": rfc3339(now - timedelta(minutes=1)),
        "too-far": rfc3339(now + timedelta(days=30, minutes=5)),
    }.get(run_at, run_at)
    r = await api.create(runAt=value, expect=None)
    assert locs(assert_problem(r, 422, "VALIDATION_FAILED")) == [["body", "runAt"]]


async def test_run_at_must_fall_within_the_input_s_retention(db: SessionMaker, env: Any) -> None:
    """With DATA_RETENTION_DAYS=2 a job's input lives two days: a `runAt` 3 days ahead could
    only fail SNAPSHOT_EXPIRED, so create and quote refuse it at the body field, naming the
    setting; one day ahead is accepted."""
    async with start_api(env(DATA_RETENTION_DAYS="2")) as short:
        late = rfc3339(datetime.now(UTC) + timedelta(days=3))
        body = {"jobType": "synthetic", "targetType": "t", "targetId": "1", "input": {}}
        for path in ("/api/ai/jobs", "/api/ai/jobs/quote"):
            r = await short.http.post(path, json=body | {"runAt": late}, headers=short.as_user())
            problem = assert_problem(r, 422, "VALIDATION_FAILED")
            assert locs(problem) == [["body", "runAt"]], problem
            assert "DATA_RETENTION_DAYS" in problem["detail"]
            assert "DATA_RETENTION_DAYS" in problem["errors"][0]["msg"]
        soon = rfc3339(datetime.now(UTC) + timedelta(days=1))
        job = (await short.create(runAt=soon)).json()
        assert job["lifecycleStatus"] == "queued"
        r = await short.http.post(
            "/api/ai/jobs/quote", json=body | {"runAt": soon}, headers=short.as_user()
        )
        assert r.status_code == 200, r.text


async def test_a_delayed_job_waits_queued_and_starts_on_time(api: Api, workers: Stack) -> None:
    run_at = (datetime.now(UTC) + timedelta(seconds=3.5)).astimezone(timezone(timedelta(hours=1)))
    job = (await api.create(runAt=rfc3339(run_at))).json()
    assert datetime.fromisoformat(job["runAt"]) == run_at
    assert job["lifecycleStatus"] == "queued"
    job_id = job["jobId"]
    # Until runAt the job is queued, whatever the workers do meanwhile.
    while datetime.now(UTC) < run_at - timedelta(seconds=0.3):
        seen = await api.get(job_id)
        assert seen["lifecycleStatus"] == "queued" and seen["startedAt"] is None, seen
        await asyncio.sleep(0.2)
    done = await api.wait_status(job_id, timeout=30)
    assert done["lifecycleStatus"] == "succeeded", done
    started = datetime.fromisoformat(done["startedAt"])
    assert run_at <= started <= run_at + timedelta(seconds=2), (run_at, started)


async def test_a_delayed_job_is_cancelled_at_once_and_never_starts(
    api: Api, workers: Stack, temporal_client: Client, db: SessionMaker
) -> None:
    """Before its runAt a delayed job is not dispatched (no workflow, no room in its user's
    window); a cancel ends it in SQL at once and closes its enqueue row in the same
    transaction, so no workflow is ever started for it."""
    job_id = await api.create_id(runAt=rfc3339(datetime.now(UTC) + timedelta(minutes=10)))
    wf = temporal_client.get_workflow_handle(f"ai-interactive:synthetic:{job_id}")
    async with db() as s:
        row = (
            await s.execute(
                text("SELECT dispatched_at, due_at FROM ai_job WHERE id = :id"),
                {"id": uuid.UUID(job_id)},
            )
        ).one()
    assert row.dispatched_at is None and row.due_at is not None
    r = await api.cancel(job_id)
    assert r.status_code == 200 and r.json()["cancelOutcome"] == "cancelled", r.text
    assert (await api.get(job_id))["lifecycleStatus"] == "cancelled"
    async with db() as s:
        status, error = (
            await s.execute(
                text(
                    "SELECT status, last_error FROM outbox_event "
                    "WHERE aggregate_id = :a AND event_type = 'ai.job.enqueue'"
                ),
                {"a": job_id},
            )
        ).one()
    assert status == "published" and "ended before it was dispatched" in error
    with pytest.raises(RPCError):  # the relay had nothing to start
        await wf.describe()


# ---- the owner's retry ----------------------------------------------------------------------


async def test_the_owner_retries_their_own_cancelled_job(api: Api) -> None:
    meta = {"courseId": "C42"}
    old = await api.create_id(metadata=meta, targetId="L9")
    assert (await api.cancel(old)).status_code == 200
    r = await api.http.post(f"/api/ai/jobs/{old}/retry", headers=api.as_user())
    assert r.status_code == 201, r.text
    new = r.json()
    assert new["retriedFromJobId"] == old and new["jobId"] != old
    assert new["lifecycleStatus"] == "queued"
    assert (new["metadata"], new["targetId"]) == (meta, "L9")
    assert r.headers["location"] == f"/api/ai/jobs/{new['jobId']}"

    again = await api.http.post(f"/api/ai/jobs/{old}/retry", headers=api.as_user())
    assert again.status_code == 200 and again.json()["jobId"] == new["jobId"], again.text

    # Someone else's job is not found; a job that is not failed or cancelled is not retryable.
    other = await api.http.post(f"/api/ai/jobs/{old}/retry", headers=api.as_user("bob"))
    assert_problem(other, 404, "JOB_NOT_FOUND")
    missing = await api.http.post(f"/api/ai/jobs/{uuid.uuid4()}/retry", headers=api.as_user())
    assert_problem(missing, 404, "JOB_NOT_FOUND")
    queued = await api.http.post(f"/api/ai/jobs/{new['jobId']}/retry", headers=api.as_user())
    assert_problem(queued, 409, "JOB_NOT_RETRYABLE")


async def test_the_owners_retry_counts_against_their_quotas(db: SessionMaker, env: Any) -> None:
    async with start_api(env(QUOTA_MAX_ACTIVE_JOBS=1)) as q:
        old = await q.create_id("carol")
        assert (await q.cancel(old, "carol")).status_code == 200
        busy = await q.create_id("carol")  # the one active job carol may have
        r = await q.http.post(f"/api/ai/jobs/{old}/retry", headers=q.as_user("carol"))
        assert_problem(r, 429, "TOO_MANY_JOBS")
        assert (await q.cancel(busy, "carol")).status_code == 200
        r = await q.http.post(f"/api/ai/jobs/{old}/retry", headers=q.as_user("carol"))
        assert r.status_code == 201 and r.json()["retriedFromJobId"] == old, r.text


async def test_the_status_event_carries_target_and_metadata(api: Api) -> None:
    meta = {"courseId": "C42"}
    job_id = await api.create_id(metadata=meta, targetId="L7")
    url = f"/api/ai/jobs/{job_id}/events"
    async with api.http.stream("GET", url, headers=api.as_user()) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                data = json.loads(line[len("data:") :])
                break
    assert (data["jobId"], data["targetId"], data["metadata"]) == (job_id, "L7", meta)
