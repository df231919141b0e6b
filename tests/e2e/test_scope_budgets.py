"""Money above the user, from outside: the real API over HTTP, workers and relay in process, an
OpenAI-compatible mock (tests/fakes/openai_server.py) as the provider of the priced model, and
tokens that carry `org` and `teams`.

- a team's budget holds 30 creates racing from three of its users, each refusal naming the
  team; its `reservedUsd` is the admitted jobs' reservations while the provider holds their
  calls, its `spentUsd` their cost once they end; usage grouped by team, organisation and tag
  is the sum of the jobs' own usage;
- a monthly tag budget refuses only its tag, a quote names it, and once it is deleted the tag
  is admitted again; tags and budgets are validated; the routes are audited;
- an organisation's budget with `alertAt` sends one signed `ai.budget.threshold_crossed` per
  crossed threshold to an admin webhook, within seconds of the call that crossed it, and after
  a PUT only the threshold it passed before.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from activities.webhooks import WebhookConfig, WebhookDeliverer
from api.auth import JwtConfig, issue_token
from db.session import SessionMaker
from jobs.credentials import credential_cipher
from tests.e2e.conftest import Api, assert_problem, bearer, start_api
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import FAKE_MODEL, PLATFORM_KEY
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, engine_stack
from tests.support import eventually
from tests.webhook_helpers import receiver, verified_by

pytestmark = pytest.mark.slow

QUIZ = "quiz_generation"
ORG = "school-1"
CENT = Decimal("0.00000001")


def usd(value: Any) -> Decimal:
    return Decimal(str(value))


def provider_env(base_url: str) -> dict[str, Any]:
    return {
        "AI_BASE_URL": base_url,
        "USER_KEY_ALLOWED_BASE_URLS": base_url,
        "DEEPSEEK_API_KEY": PLATFORM_KEY,
        "AI_MODEL": FAKE_MODEL,
        "AI_INTERACTIVE_CONCURRENCY": 8,
        "AI_BACKGROUND_CONCURRENCY": 8,
    }


@contextlib.asynccontextmanager
async def engine_and_api(
    env: Any, client: Client, base_url: str, *, workers: bool = True, **overrides: Any
) -> AsyncIterator[Api]:
    settings = env(**provider_env(base_url), **overrides)
    async with contextlib.AsyncExitStack() as stack:
        if workers:
            await stack.enter_async_context(engine_stack(settings, client, queues=JOB_QUEUES))
        yield await stack.enter_async_context(start_api(settings, temporal=client))


def member(api: Api, user: str, *teams: str, org: str | None = ORG) -> dict[str, str]:
    cfg = JwtConfig.from_settings(api.settings)
    return bearer(issue_token(cfg, user, org=org, teams=list(teams), ttl_s=3600))


def quiz_body(**extra: Any) -> dict[str, Any]:
    target = f"L-{uuid.uuid4().hex[:8]}"
    return {"jobType": QUIZ, "targetType": "lesson", "targetId": target, "input": INPUTS[QUIZ]} | (
        extra
    )


async def create(api: Api, headers: dict[str, str], **extra: Any) -> httpx.Response:
    return await api.http.post("/api/ai/jobs", json=quiz_body(**extra), headers=headers)


async def quote(api: Api, headers: dict[str, str], **extra: Any) -> dict[str, Any]:
    r = await api.http.post("/api/ai/jobs/quote", json=quiz_body(**extra), headers=headers)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def put_budget(api: Api, scope: str, scope_id: str, **body: Any) -> dict[str, Any]:
    r = await api.http.put(
        f"/admin-api/ai/budgets/{scope}/{scope_id}", json=body, headers=api.as_admin()
    )
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def get_budget(api: Api, scope: str, scope_id: str) -> dict[str, Any]:
    r = await api.http.get(f"/admin-api/ai/budgets/{scope}/{scope_id}", headers=api.as_admin())
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def job_cost(api: Api, job: str) -> tuple[int, Decimal]:
    r = await api.http.get(f"/api/ai/jobs/{job}/usage", headers=api.as_admin())
    assert r.status_code == 200, r.text
    return int(r.json()["calls"]), usd(r.json()["costUsd"])


async def usage(api: Api, **params: str) -> dict[str, Any]:
    r = await api.http.get("/admin-api/ai/usage", params=params, headers=api.as_admin())
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def items(report: dict[str, Any]) -> dict[str, tuple[int, Decimal]]:
    return {i["key"]: (i["calls"], usd(i["costUsd"])) for i in report["items"]}


def sums(costs: list[tuple[int, Decimal]]) -> tuple[int, Decimal]:
    return sum(c for c, _ in costs), sum((d for _, d in costs), Decimal(0))


# ---- 1. a team budget under racing creates, and usage by scope ------------------------------


async def test_a_team_budget_holds_thirty_racing_creates_and_usage_groups_by_scope(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    # The provider holds every call until released: reservations stay open meanwhile.
    answer = {"kind": "valid", "content": SCRIPTED[QUIZ], "tokens_in": 50, "tokens_out": 50}
    await fake.ascript([], default={**answer, "hold_at": 0})
    async with engine_and_api(env, temporal_client, fake.base_url) as api:
        users = {
            "t1": member(api, "t1", "class-a"),
            "t2": member(api, "t2", "class-a", "class-b"),
            "t3": member(api, "t3", "class-a"),
        }
        worst = usd((await quote(api, users["t1"]))["worstCaseCostUsd"])
        budget = (worst * Decimal("5.5")).quantize(CENT)
        put = await put_budget(api, "team", "class-a", limitUsd=str(budget), period="day")
        assert (put["scope"], put["scopeId"], usd(put["limitUsd"])) == ("team", "class-a", budget)
        assert usd(put["spentUsd"]) == usd(put["reservedUsd"]) == 0 and put["alertAt"] == []
        order = [u for _ in range(10) for u in users]
        burst = await asyncio.gather(
            *(create(api, users[u], tags=["unit-1"] if i % 2 else []) for i, u in enumerate(order))
        )
        # (owner, job, tagged) of each admitted create.
        admitted = [
            (order[i], r.json()["jobId"], bool(i % 2))
            for i, r in enumerate(burst)
            if r.status_code == 202
        ]
        assert len(admitted) in (5, 6), [r.status_code for r in burst]
        for r in burst:
            if r.status_code != 202:
                refusal = assert_problem(r, 429, "QUOTA_EXCEEDED")
                named = (refusal["scope"], refusal["scopeId"], refusal["period"])
                assert named == ("team", "class-a", "day")
                assert int(r.headers["retry-after"]) >= 1

        async def all_held() -> bool:
            return int((await fake.astreams()).get("held", 0)) >= len(admitted)

        await eventually(all_held, timeout=30, what="every admitted job's call to be held")
        held = await get_budget(api, "team", "class-a")
        assert usd(held["reservedUsd"]) == worst * len(admitted) <= budget
        assert usd(held["spentUsd"]) == 0
        # An outsider's job is not this budget's business; a member's quote names it.
        other = await create(api, member(api, "x1", org="school-2"))
        assert other.status_code == 202, other.text
        q = await quote(api, users["t1"])
        assert q["admitted"] is False and q["refusal"]["limit"] == "scope_budget"
        assert (q["refusal"]["scope"], q["refusal"]["scopeId"]) == ("team", "class-a")
        assert any(b["scope"] == "team" and b["scopeId"] == "class-a" for b in q["budgets"])

        await fake.arelease()
        owners = {job: user for user, job, _ in admitted} | {other.json()["jobId"]: "x1"}
        for job, user in owners.items():
            assert (await api.wait_status(job, user=user))["lifecycleStatus"] == "succeeded"
        costs = {job: await job_cost(api, job) for job in owners}
        mine = [job for _, job, _ in admitted]
        ended = await get_budget(api, "team", "class-a")
        assert usd(ended["reservedUsd"]) == 0
        assert usd(ended["spentUsd"]) == sums([costs[j] for j in mine])[1] > 0

        # Usage of one organisation by team, organisation and tag: the jobs' own sums; a job of
        # two teams counts in both, the total counts it once.
        of_b = [job for user, job, _ in admitted if user == "t2"]
        tagged = [job for _, job, tag in admitted if tag]
        by_team = await usage(api, orgId=ORG, groupBy="team")
        assert items(by_team) == {
            "class-a": sums([costs[j] for j in mine]),
            **({"class-b": sums([costs[j] for j in of_b])} if of_b else {}),
        }
        total = (by_team["total"]["calls"], usd(by_team["total"]["costUsd"]))
        assert total == sums([costs[j] for j in mine])
        by_org = await usage(api, orgId=ORG, groupBy="org")
        assert items(by_org) == {ORG: sums([costs[j] for j in mine])}
        by_tag = await usage(api, orgId=ORG, groupBy="tag")
        assert items(by_tag) == ({"unit-1": sums([costs[j] for j in tagged])} if tagged else {})
        assert (by_tag["total"]["calls"], usd(by_tag["total"]["costUsd"])) == total
        everyone = await usage(api, groupBy="org")
        assert items(everyone)["school-2"] == costs[other.json()["jobId"]]
        everything = (everyone["total"]["calls"], usd(everyone["total"]["costUsd"]))
        assert everything == sums(list(costs.values()))
        assert items(await usage(api, teamId="class-b", groupBy="user")) == (
            {"t2": sums([costs[j] for j in of_b])} if of_b else {}
        )


# ---- 2. a tag budget, validation and audit --------------------------------------------------


async def test_a_monthly_tag_budget_refuses_only_its_tag_until_it_is_deleted(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    # No workers: the jobs stay queued, each holding its reservation.
    async with engine_and_api(env, temporal_client, fake.base_url, workers=False) as api:
        alice = member(api, "alice", "class-a")
        worst = usd((await quote(api, alice))["worstCaseCostUsd"])
        room_for_one = str((worst * Decimal("1.5")).quantize(CENT))
        await put_budget(api, "tag", "unit-7", limitUsd=room_for_one, period="month")
        first = await create(api, alice, tags=["unit-7", "extra"])
        assert first.status_code == 202, first.text
        assert first.json()["tags"] == ["unit-7", "extra"]  # kept as given, in order
        refused = assert_problem(
            await create(api, alice, tags=["extra", "unit-7"]), 429, "QUOTA_EXCEEDED"
        )
        assert (refused["scope"], refused["scopeId"], refused["period"]) == (
            "tag",
            "unit-7",
            "month",
        )
        q = await quote(api, alice, tags=["unit-7"])
        assert q["refusal"]["limit"] == "scope_budget" and q["refusal"]["scopeId"] == "unit-7"
        [tag_budget] = [b for b in q["budgets"] if b["scope"] == "tag"]
        assert (tag_budget["period"], usd(tag_budget["reservedUsd"])) == ("month", worst)
        assert (await create(api, alice, tags=["unit-8"])).status_code == 202
        untagged = await create(api, alice)
        assert untagged.status_code == 202 and untagged.json()["tags"] == []
        for tags, loc in (
            (["bad tag"], ["body", "tags", "0"]),
            (["a", "a"], ["body", "tags"]),
            ([f"t{i}" for i in range(11)], ["body", "tags"]),
            ([""], ["body", "tags", "0"]),
            ("unit-7", ["body", "tags"]),
        ):
            bad = assert_problem(await create(api, alice, tags=tags), 422, "VALIDATION_FAILED")
            assert [e["loc"][: len(loc)] for e in bad["errors"]] == [loc], bad
        r = await api.http.delete("/admin-api/ai/budgets/tag/unit-7", headers=api.as_admin())
        assert r.status_code == 204
        assert (await create(api, alice, tags=["unit-7"])).status_code == 202
        r = await api.http.get("/admin-api/ai/budgets/tag/unit-7", headers=api.as_admin())
        assert_problem(r, 404, "BUDGET_NOT_FOUND")
        r = await api.http.delete("/admin-api/ai/budgets/tag/unit-7", headers=api.as_admin())
        assert_problem(r, 404, "BUDGET_NOT_FOUND")
        # Tags are part of the request an Idempotency-Key stands for; absent is [].
        keyed = {**alice, "Idempotency-Key": "k-1"}
        body = quiz_body()
        made = await api.http.post("/api/ai/jobs", json=body, headers=keyed)
        again = await api.http.post("/api/ai/jobs", json={**body, "tags": []}, headers=keyed)
        assert (made.status_code, again.status_code) == (202, 200)
        assert again.json()["jobId"] == made.json()["jobId"]
        other = await api.http.post("/api/ai/jobs", json={**body, "tags": ["x"]}, headers=keyed)
        assert_problem(other, 422, "IDEMPOTENCY_KEY_REUSED")
        await _budget_routes_are_validated_and_audited(api)


async def _budget_routes_are_validated_and_audited(api: Api) -> None:
    admin = api.as_admin()
    ok = {"limitUsd": "25.00", "period": "day", "alertAt": [0.5, 0.8]}
    for path, body in (
        ("/admin-api/ai/budgets/school/x", ok),
        ("/admin-api/ai/budgets/team/bad%20id", ok),
        ("/admin-api/ai/budgets/org/" + "o" * 65, ok),
        ("/admin-api/ai/budgets/org/o1", {**ok, "limitUsd": "0"}),
        ("/admin-api/ai/budgets/org/o1", {**ok, "limitUsd": "1.000000001"}),
        ("/admin-api/ai/budgets/org/o1", {**ok, "period": "week"}),
        ("/admin-api/ai/budgets/org/o1", {**ok, "alertAt": [1.5]}),
        ("/admin-api/ai/budgets/org/o1", {**ok, "alertAt": [0]}),
        ("/admin-api/ai/budgets/org/o1", {**ok, "alertAt": [0.1] * 11}),
        ("/admin-api/ai/budgets/org/o1", {**ok, "extra": 1}),
    ):
        assert_problem(await api.http.put(path, json=body, headers=admin), 422, "VALIDATION_FAILED")
    r = await api.http.put("/admin-api/ai/budgets/org/o1", json=ok, headers=api.as_user("u"))
    assert_problem(r, 403, "FORBIDDEN")
    out = await put_budget(api, "org", "o1", **ok)
    assert (out["limitUsd"], out["period"], out["alertAt"]) == ("25.00000000", "day", [0.5, 0.8])
    tomorrow = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)
    assert out["resetsAt"].startswith(tomorrow.isoformat())
    listed = (
        await api.http.get("/admin-api/ai/budgets", params={"scope": "org"}, headers=admin)
    ).json()
    assert [(b["scope"], b["scopeId"]) for b in listed["items"]] == [("org", "o1")]
    r = await api.http.get("/admin-api/ai/audit", params={"action": "budget.put"}, headers=admin)
    assert r.status_code == 200, r.text
    assert {e["targetId"] for e in r.json()["items"]} >= {"tag:unit-7", "org:o1"}
    r = await api.http.get("/admin-api/ai/audit", params={"action": "budget.delete"}, headers=admin)
    assert [e["outcome"] for e in r.json()["items"]].count("deleted") == 1


# ---- 3. alerts to an admin webhook ----------------------------------------------------------

# Input free, output at 1000 USD per million: a quiz's worst case is its 4096-token answer
# budget, 4.096 USD, and an answer of 2662 tokens costs 0.65 of it.
PRICES = '{"deepseek-chat": {"input": 0, "output": 1000}}'
DELIVERER = WebhookConfig(allow_private=True, poll_interval_s=0.2, retry_base_s=0.3)


async def test_an_org_budget_sends_one_signed_alert_per_crossed_threshold(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    answer = {"kind": "valid", "content": SCRIPTED[QUIZ], "tokens_in": 10, "tokens_out": 2662}
    await fake.ascript([], default=answer)
    async with (
        engine_and_api(env, temporal_client, fake.base_url, AI_MODEL_PRICES=PRICES) as api,
        _deliverer(api),
    ):
        alice = member(api, "alice", "class-a")
        worst = usd((await quote(api, alice))["worstCaseCostUsd"])
        assert worst == Decimal("4.096")
        limit = str(worst * Decimal("2.4"))
        with receiver() as rec:
            r = await api.http.post(
                "/admin-api/ai/webhooks", json={"url": rec.url}, headers=api.as_admin()
            )
            assert r.status_code == 201, r.text
            hook = r.json()
            assert hook["eventTypes"] == ["ai.budget.threshold_crossed"]
            assert hook["secret"].startswith("whsec_")
            listed = await api.http.get("/admin-api/ai/webhooks", headers=api.as_admin())
            assert [h["webhookId"] for h in listed.json()["items"]] == [hook["webhookId"]]
            mine = await api.http.get("/api/ai/webhooks", headers=api.as_user("alice"))
            assert mine.json()["items"] == []  # no user sees an admin webhook
            await put_budget(
                api, "org", ORG, limitUsd=limit, period="month", alertAt=[0.25, 0.5, 0.9]
            )
            # Jobs one after another until the spend passes half the limit.
            ended: list[dt.datetime] = []
            for n in (1, 2):
                job = (await create(api, alice)).json()["jobId"]
                done = await api.wait_status(job, user="alice")
                assert done["lifecycleStatus"] == "succeeded", done
                ended.append(dt.datetime.fromisoformat(done["finishedAt"]))
                got = await rec.wait_for(n, timeout=15)
            await asyncio.sleep(1.0)  # nothing else arrives (no event for 0.9)
            events = [json.loads(x.body) for x in rec.requests]
            assert [e["data"]["threshold"] for e in events] == [0.25, 0.5]
            for event, req, at in zip(events, got, ended, strict=True):
                assert verified_by(hook["secret"], req)
                assert event["type"] == "ai.budget.threshold_crossed"
                data = event["data"]
                assert (data["scope"], data["scopeId"], data["period"]) == ("org", ORG, "month")
                assert data["periodStart"] == at.date().replace(day=1).isoformat()
                assert usd(data["limitUsd"]) == usd(limit)
                assert usd(data["spentUsd"]) >= usd(limit) * usd(data["threshold"])
                assert req.at - at.timestamp() < 5  # within seconds of the crossing call
            # A PUT sends nothing; a threshold it adds that is already passed goes at the next
            # call, once; those sent this period never again.
            await put_budget(
                api, "org", ORG, limitUsd=limit, period="month", alertAt=[0.25, 0.5, 0.52, 0.9]
            )
            await asyncio.sleep(0.5)
            assert len(rec.requests) == 2
            job = (await create(api, alice)).json()["jobId"]
            await api.wait_status(job, user="alice")
            [third] = (await rec.wait_for(3, timeout=15))[2:]
            assert json.loads(third.body)["data"]["threshold"] == 0.52
            # The admin deliveries list shows them; a replay sends one again, same webhook-id.
            r = await api.http.get("/admin-api/ai/webhook-deliveries", headers=api.as_admin())
            listed = r.json()["items"]
            assert [d["eventType"] for d in listed] == ["ai.budget.threshold_crossed"] * 3
            assert all(d["jobId"].startswith("budget:") for d in listed)
            first = listed[-1]
            r = await api.http.post(
                f"/admin-api/ai/webhook-deliveries/{first['id']}/replay", headers=api.as_admin()
            )
            assert r.status_code == 200, r.text
            [replayed] = (await rec.wait_for(4, timeout=15))[3:]
            assert replayed.headers["webhook-id"] == got[0].headers["webhook-id"]
            assert json.loads(replayed.body)["data"] == events[0]["data"]
        r = await api.http.post(
            f"/admin-api/ai/webhooks/{hook['webhookId']}/rotate", headers=api.as_admin()
        )
        assert r.status_code == 200 and r.json()["secret"] != hook["secret"]
        r = await api.http.delete(
            f"/admin-api/ai/webhooks/{hook['webhookId']}", headers=api.as_admin()
        )
        assert r.status_code == 204
        r = await api.http.delete(
            f"/admin-api/ai/webhooks/{hook['webhookId']}", headers=api.as_admin()
        )
        assert_problem(r, 404, "WEBHOOK_NOT_FOUND")
        audit = await api.http.get("/admin-api/ai/audit", headers=api.as_admin())
        actions = {e["action"] for e in audit.json()["items"]}
        assert {"admin_webhook.create", "admin_webhook.rotate", "admin_webhook.delete"} <= actions


@contextlib.asynccontextmanager
async def _deliverer(api: Api) -> AsyncIterator[WebhookDeliverer]:
    d = WebhookDeliverer(
        api.app.state.aijobs.sessionmaker, credential_cipher(api.settings), DELIVERER
    )
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    try:
        yield d
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
