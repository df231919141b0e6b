"""Flow control's members and routes over HTTP, their mistakes included (the shared server, no
workers): `concurrency`, `ttlSeconds` and `deadline` on a create and a quote (422 located under
the member), on a schedule's job template (`ttlSeconds` only), in every view of a job and in the
job-types listing; the operator pause routes (201, list, 204, 404 `PAUSE_NOT_FOUND`, 403, 422)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tests.e2e.conftest import Api, assert_problem

SYN = {"jobType": "synthetic", "targetType": "lesson", "targetId": "L1", "input": {}}


def ahead(**delta: float) -> str:
    return (datetime.now(UTC) + timedelta(**delta)).isoformat()


async def create(api: Api, **extra: Any) -> httpx.Response:
    return await api.http.post("/api/ai/jobs", json={**SYN, **extra}, headers=api.as_user())


def loc(r: httpx.Response) -> list[str]:
    body = assert_problem(r, 422, "VALIDATION_FAILED")
    return [str(p) for p in body["errors"][0]["loc"]]


async def test_the_members_are_checked_and_each_mistake_is_located(api: Api) -> None:
    debounce = {"key": "k", "mode": "debounce", "delayMs": 4000}
    mistakes: list[tuple[dict[str, Any], list[str]]] = [
        ({"concurrency": {"key": "k", "mode": "queue"}}, ["body", "concurrency"]),
        ({"concurrency": {"key": "k"}}, ["body", "concurrency"]),
        ({"concurrency": {"key": "k", "mode": "debounce"}}, ["body", "concurrency"]),
        ({"concurrency": {**debounce, "delayMs": 99}}, ["body", "concurrency"]),
        ({"concurrency": {**debounce, "maxDelayMs": 3000}}, ["body", "concurrency"]),
        ({"concurrency": {"key": "k", "mode": "skip", "delayMs": 500}}, ["body", "concurrency"]),
        ({"concurrency": {"key": "two words", "mode": "skip"}}, ["body", "concurrency"]),
        ({"concurrency": {"key": "k" * 201, "mode": "skip"}}, ["body", "concurrency"]),
        ({"ttlSeconds": -1}, ["body", "ttlSeconds"]),
        ({"ttlSeconds": 2_592_001}, ["body", "ttlSeconds"]),
        ({"ttlSeconds": "60"}, ["body", "ttlSeconds"]),
        ({"ttlSeconds": 2, "concurrency": debounce}, ["body", "ttlSeconds"]),
        ({"deadline": ahead(seconds=-5)}, ["body", "deadline"]),
        ({"deadline": ahead(days=31)}, ["body", "deadline"]),
        ({"deadline": "2030-01-01T00:00:00"}, ["body", "deadline"]),
        ({"runAt": ahead(hours=2), "deadline": ahead(hours=1)}, ["body", "deadline"]),
        ({"deadline": ahead(seconds=2), "concurrency": debounce}, ["body", "deadline"]),
    ]
    for extra, where in mistakes:
        for route in ("/api/ai/jobs", "/api/ai/jobs/quote"):
            r = await api.http.post(route, json={**SYN, **extra}, headers=api.as_user())
            assert loc(r)[: len(where)] == where, (route, extra, r.text)
    listed = await api.http.get("/api/ai/jobs", headers=api.as_user())
    assert listed.json()["items"] == []


async def test_a_view_carries_the_members_as_given(api: Api) -> None:
    deadline = ahead(hours=1)
    r = await create(
        api, concurrency={"key": "notes-7", "mode": "skip"}, ttlSeconds=600, deadline=deadline
    )
    assert r.status_code == 202, r.text
    view = r.json()
    assert view["concurrency"] == {
        "key": "notes-7",
        "mode": "skip",
        "delayMs": None,
        "maxDelayMs": None,
    }
    assert view["supersededBy"] is None
    assert datetime.fromisoformat(view["deadline"]) == datetime.fromisoformat(deadline)
    created = datetime.fromisoformat(view["createdAt"])
    expires = datetime.fromisoformat(view["expiresAt"])
    assert abs((expires - created).total_seconds() - 600) < 2
    plain = (await create(api, targetId="L2")).json()
    assert (plain["concurrency"], plain["expiresAt"], plain["deadline"]) == (None, None, None)
    # A quote takes the members and its figures do not change with them.
    q = {**SYN, "concurrency": {"key": "x", "mode": "debounce", "delayMs": 500}}
    with_flow = await api.http.post(
        "/api/ai/jobs/quote", json={**q, "ttlSeconds": 60}, headers=api.as_user()
    )
    without = await api.http.post("/api/ai/jobs/quote", json=SYN, headers=api.as_user())
    assert with_flow.status_code == without.status_code == 200, with_flow.text
    figures = ("estimatedCostUsd", "worstCaseCostUsd", "estimatedInputTokens")
    assert [with_flow.json()[f] for f in figures] == [without.json()[f] for f in figures]
    types = (await api.http.get("/api/ai/job-types", headers=api.as_user())).json()["items"]
    assert all("ttlSeconds" in t and t["ttlSeconds"] is None for t in types)


async def test_a_schedule_takes_a_ttl_but_no_key_or_deadline(api: Api) -> None:
    base = {"jobType": "synthetic", "input": {}, "intervalSeconds": 3600}
    r = await api.http.post(
        "/api/ai/schedules", json={**base, "ttlSeconds": 120}, headers=api.as_user()
    )
    assert r.status_code == 201, r.text
    assert r.json()["ttlSeconds"] == 120
    for extra in ({"concurrency": {"key": "k", "mode": "skip"}}, {"deadline": ahead(hours=1)}):
        r = await api.http.post("/api/ai/schedules", json={**base, **extra}, headers=api.as_user())
        assert loc(r)[:2] == ["body", next(iter(extra))], r.text


async def test_the_pause_routes(api: Api) -> None:
    admin = api.as_admin("ops")
    bad: list[dict[str, Any]] = [
        {"match": {}, "reason": "r"},
        {"match": {"jobType": "no_such_type"}, "reason": "r"},
        {"match": {"userId": "u"}, "reason": ""},
        {"match": {"userId": "u"}, "reason": "r" * 501},
        {"match": {"userId": "u"}, "reason": "r", "expiresAt": ahead(seconds=-1)},
        {"match": {"userId": "u", "color": "red"}, "reason": "r"},
    ]
    for body in bad:
        r = await api.http.post("/admin-api/ai/pauses", json=body, headers=admin)
        assert loc(r)[0] == "body", (body, r.text)
    user = await api.http.post(
        "/admin-api/ai/pauses",
        json={"match": {"userId": "u"}, "reason": "r"},
        headers=api.as_user(),
    )
    assert_problem(user, 403, "FORBIDDEN")
    body = {"match": {"provider": "synthetic", "model": "synthetic"}, "reason": "slow model"}
    expires = ahead(hours=1)
    r = await api.http.post(
        "/admin-api/ai/pauses", json={**body, "expiresAt": expires}, headers=admin
    )
    assert r.status_code == 201, r.text
    pause = r.json()
    assert pause["match"] == {**body["match"], "jobType": None, "userId": None}
    assert (pause["reason"], pause["createdBy"]) == ("slow model", "ops")
    assert datetime.fromisoformat(pause["expiresAt"]) == datetime.fromisoformat(expires)
    listed = (await api.http.get("/admin-api/ai/pauses", headers=admin)).json()["items"]
    assert listed == [pause]
    # Creates still answer 202 while a pause holds their calls.
    assert (await create(api)).status_code == 202
    gone = await api.http.delete(f"/admin-api/ai/pauses/{pause['pauseId']}", headers=admin)
    assert gone.status_code == 204
    again = await api.http.delete(f"/admin-api/ai/pauses/{pause['pauseId']}", headers=admin)
    assert_problem(again, 404, "PAUSE_NOT_FOUND")
    assert (await api.http.get("/admin-api/ai/pauses", headers=admin)).json()["items"] == []
