"""Rollouts and feedback through the API, with jobs run by the engine against two fake
OpenAI-compatible servers: the primary (`deepseek-chat`) and an AI_FALLBACKS entry
(`gpt-4o-mini`) that the canary arm tries first.

A 90/10 rollout (guard: 4 samples, mean feedback 0, success rate 0.5): each user keeps one arm,
each arm's jobs go to its own model and carry their arm in every view; feedback is the owner's,
of a succeeded job, one per job; after four -1 on the canary and four +1 on the stable arm the
guard halts the canary (audited as `system`), `GET` shows each arm's figures, and the canary's
users get `stable` from their next create. A create pinning a version is outside the rollout.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from temporalio.client import Client

from db.rollouts import ArmRow, RolloutRow
from db.session import SessionMaker
from engine.settings import Settings
from jobs.rollouts import choose
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import api_client, auth, fake_env
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, Stack, engine_stack, make_settings
from tests.support import eventually

FLASH = "flashcard_generation"
CANARY_MODEL = "gpt-4o-mini"
ROLLOUT = f"/admin-api/ai/job-types/{FLASH}/rollout"
BODY: dict[str, Any] = {
    "arms": [
        {"name": "stable", "promptVersion": f"{FLASH}.v2", "weight": 90},
        {"name": "canary", "model": CANARY_MODEL, "weight": 10},
    ],
    "guard": {"minSamples": 4, "minMeanFeedback": 0, "minSuccessRate": 0.5},
}


@pytest.fixture(scope="module")
def second_server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def second(second_server: FakeOpenAIServer) -> FakeOpenAIServer:
    second_server.reset()
    return second_server


def _users(arm: str, n: int) -> list[str]:
    """`n` user ids the 90/10 rollout puts on `arm` (its choice is a pure function)."""
    arms = (ArmRow("stable", 0, f"{FLASH}.v2", None, 90), ArmRow("canary", 1, None, "x", 10))
    rollout = RolloutRow(FLASH, uuid.uuid4(), 4, 0, 0, None, arms)  # type: ignore[arg-type]
    out = []
    for i in range(10_000):
        user = f"user-{i}"
        if choose(rollout, FLASH, user).name == arm:
            out.append(user)
            if len(out) == n:
                return out
    raise AssertionError("no users for the arm")


async def _create(c: httpx.AsyncClient, settings: Settings, user: str, **extra: Any) -> Any:
    body = {"jobType": FLASH, "targetType": "deck", "targetId": "d1", "input": INPUTS[FLASH]}
    got = await c.post("/api/ai/jobs", json={**body, **extra}, headers=auth(settings, user))
    assert got.status_code == 202, got.text
    return got.json()


async def _feedback(
    c: httpx.AsyncClient, settings: Settings, user: str, job_id: str, body: dict[str, Any]
) -> httpx.Response:
    return await c.post(f"/api/ai/jobs/{job_id}/feedback", json=body, headers=auth(settings, user))


async def _succeeded(stack: Stack, job_id: str) -> Any:
    row = await stack.wait_status(uuid.UUID(job_id), "succeeded", "failed", timeout=60)
    assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
    return row


async def test_put_refuses_what_is_not_right_and_get_delete_need_a_rollout(
    db: SessionMaker, database_url: str, temporal_address: str, fake: FakeOpenAIServer
) -> None:
    chain = [{"model": CANARY_MODEL, "baseUrl": fake.base_url, "apiKey": "sk-f"}]
    settings = make_settings(
        database_url, temporal_address, **fake_env(fake, AI_FALLBACKS=json.dumps(chain))
    )
    admin = auth(settings, "root", admin=True)
    arms = BODY["arms"]
    wrong: list[Any] = [
        {"arms": [{**arms[0], "weight": 80}, arms[1]]},  # sums to 90
        {"arms": [arms[0], {**arms[1], "name": "stable"}]},  # a name twice
        {"arms": [{**arms[0], "promptVersion": f"{FLASH}.v9"}, arms[1]]},  # not listed
        {"arms": [arms[0], {**arms[1], "model": "gpt-5-unknown"}]},  # not configured
        {"arms": [{"name": "bare", "weight": 100}]},  # neither version nor model
        {"arms": [{**arms[0], "weight": 89.5}, {**arms[1], "weight": 10.5}]},  # not integers
        {"arms": [{**arms[0], "weight": "90"}, arms[1]]},  # a string
        {"arms": [{**arms[0], "name": "no spaces"}, arms[1]]},
        {**BODY, "extra": 1},
        {**BODY, "guard": {"minSamples": True}},
    ]
    async with api_client(settings) as (_, c):
        assert (await c.get(ROLLOUT, headers=admin)).json()["code"] == "ROLLOUT_NOT_FOUND"
        gone = await c.delete(ROLLOUT, headers=admin)
        assert (gone.status_code, gone.json()["code"]) == (404, "ROLLOUT_NOT_FOUND")
        for body in wrong:
            got = await c.put(ROLLOUT, json=body, headers=admin)
            assert (got.status_code, got.json()["code"]) == (422, "VALIDATION_FAILED"), body
        assert (await c.get(ROLLOUT, headers=admin)).status_code == 404  # nothing changed
        user = await c.put(ROLLOUT, json=BODY, headers=auth(settings, "u1"))
        assert user.status_code == 403
        put = await c.put(ROLLOUT, json=BODY, headers=admin)
        assert put.status_code == 200, put.text
        assert [a["state"] for a in put.json()["arms"]] == ["active", "active"]
        assert put.json()["guard"] == BODY["guard"]
        assert (await c.delete(ROLLOUT, headers=admin)).status_code == 204
        assert (await c.get(ROLLOUT, headers=admin)).status_code == 404
    async with db() as s:
        actions = (await s.execute(text("SELECT action FROM admin_audit ORDER BY id"))).scalars()
        assert list(actions) == ["rollout.put", "rollout.delete"]


async def test_a_rollout_splits_users_judges_arms_by_feedback_and_halts_the_canary(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
    second: FakeOpenAIServer,
) -> None:
    chain = [{"model": CANARY_MODEL, "baseUrl": second.base_url, "apiKey": "sk-canary"}]
    settings = make_settings(
        database_url, temporal_address, **fake_env(fake, AI_FALLBACKS=json.dumps(chain))
    )
    step = {"kind": "valid", "content": SCRIPTED[FLASH], "tokens_in": 200, "tokens_out": 100}
    await fake.ascript([], default=step)
    await second.ascript([], default=step)
    admin = auth(settings, "root", admin=True)
    canaries, stables = _users("canary", 4), _users("stable", 4)
    async with (
        engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack,
        api_client(settings) as (_, c),
    ):
        assert (await c.put(ROLLOUT, json=BODY, headers=admin)).status_code == 200
        jobs: dict[str, str] = {}
        for user in canaries + stables:
            job = await _create(c, settings, user)
            arm = "canary" if user in canaries else "stable"
            assert (job["rolloutArm"], job["promptVersion"]) == (arm, f"{FLASH}.v2")
            jobs[user] = job["jobId"]
        for user, job_id in jobs.items():
            await _succeeded(stack, job_id)
            view = await c.get(f"/api/ai/jobs/{job_id}", headers=auth(settings, user))
            arm = "canary" if user in canaries else "stable"
            assert view.json()["rolloutArm"] == arm
        # Each arm's calls went to its own model.
        assert (await second.acalls())["models"] == [CANARY_MODEL] * 4
        assert (await fake.acalls())["models"] == ["deepseek-chat"] * 4
        # A user keeps the arm; a pinned version is outside the rollout.
        again = await _create(c, settings, canaries[0])
        assert again["rolloutArm"] == "canary"
        await _succeeded(stack, again["jobId"])
        pinned = await _create(c, settings, canaries[1], promptVersion=f"{FLASH}.v2")
        assert pinned["rolloutArm"] is None

        # Feedback: the owner's only, of a succeeded job, once per job (then replaced).
        first = jobs[canaries[0]]
        other = await _feedback(c, settings, stables[0], first, {"score": 1})
        assert (other.status_code, other.json()["code"]) == (404, "JOB_NOT_FOUND")
        not_yet = await _feedback(c, settings, canaries[1], pinned["jobId"], {"score": 1})
        if not_yet.status_code != 201:  # the pinned job may have succeeded meanwhile
            assert (not_yet.status_code, not_yet.json()["code"]) == (409, "JOB_NOT_SUCCEEDED")
        for bad in ({"score": 2}, {"score": True}, {"score": 0, "comment": "x" * 2001}, {}):
            got = await _feedback(c, settings, canaries[0], first, bad)
            assert got.status_code == 422, bad
        wrong_item = await _feedback(
            c, settings, canaries[0], first, {"score": 0, "itemOrdinal": 9}
        )
        assert wrong_item.status_code == 422
        made = await _feedback(
            c, settings, canaries[0], first, {"score": 1, "itemOrdinal": 0, "comment": "fine"}
        )
        assert made.status_code == 201, made.text
        assert made.json()["rolloutArm"] == "canary" and made.json()["model"] == CANARY_MODEL
        for user in canaries:
            got = await _feedback(c, settings, user, jobs[user], {"score": -1, "comment": "bad"})
            assert got.status_code == (200 if user == canaries[0] else 201)
        for user in stables:
            assert (await _feedback(c, settings, user, jobs[user], {"score": 1})).status_code == 201

        async def halted() -> Any:
            got = (await c.get(ROLLOUT, headers=admin)).json()
            arms = {a["name"]: a for a in got["arms"]}
            return arms if arms["canary"]["state"] == "halted" else None

        arms = await eventually(halted, timeout=10, what=lambda: "the canary halted")
        canary, stable = arms["canary"], arms["stable"]
        assert canary["haltedReason"] == "feedback" and stable["state"] == "active"
        assert (canary["jobs"], canary["succeeded"], canary["failed"]) == (5, 5, 0)
        assert (canary["feedbackCount"], canary["meanFeedback"]) == (4, -1.0)
        assert (stable["jobs"], stable["feedbackCount"], stable["meanFeedback"]) == (4, 4, 1.0)
        assert stable["successRate"] == 1.0 and canary["successRate"] == 1.0
        assert float(canary["meanCostUsd"]) > 0 and len(canary["meanCostUsd"].split(".")[1]) == 8
        # The canary's users get the stable arm from their next create.
        for user in canaries:
            assert (await _create(c, settings, user))["rolloutArm"] == "stable"
        # The comment is private: the job's DELETE clears it.
        purged = await c.delete(f"/api/ai/jobs/{first}", headers=auth(settings, canaries[0]))
        assert purged.status_code == 204
    async with db() as s:
        halts = (
            await s.execute(
                text("SELECT actor, detail FROM admin_audit WHERE action = 'rollout.arm_halted'")
            )
        ).all()
        assert [(h.actor, h.detail["arm"]) for h in halts] == [("system", "canary")]
        comments = (
            await s.execute(
                text("SELECT job_id::text AS j, comment FROM ai_job_feedback ORDER BY 1")
            )
        ).all()
        assert {r.j: r.comment for r in comments}[first] is None
        assert sum(r.comment == "bad" for r in comments) == 3


async def test_an_arm_whose_jobs_fail_is_halted_for_its_success_rate_never_the_last(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
    second: FakeOpenAIServer,
) -> None:
    chain = [{"model": CANARY_MODEL, "baseUrl": second.base_url, "apiKey": "sk-canary"}]
    settings = make_settings(
        database_url, temporal_address, **fake_env(fake, AI_FALLBACKS=json.dumps(chain))
    )
    await fake.ascript([], default={"kind": "status", "status": 400, "message": "bad"})
    await second.ascript([], default={"kind": "status", "status": 400, "message": "bad"})
    admin = auth(settings, "root", admin=True)
    async with (
        engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack,
        api_client(settings) as (_, c),
    ):
        assert (await c.put(ROLLOUT, json=BODY, headers=admin)).status_code == 200
        created = [await _create(c, settings, u) for u in _users("canary", 4) + _users("stable", 4)]
        for job in created:
            row = await stack.wait_status(uuid.UUID(job["jobId"]), timeout=60)
            assert (row.lifecycle_status, row.error_code) == ("failed", "REQUEST_REJECTED")
        got = (await c.get(ROLLOUT, headers=admin)).json()
    states = {a["name"]: (a["state"], a["haltedReason"], a["successRate"]) for a in got["arms"]}
    # Both fell under the floor; whichever ended first was halted, the last active one stays.
    assert sorted(s for s, _, _ in states.values()) == ["active", "halted"]
    assert {r for _, r, _ in states.values()} == {"success_rate", None}
    assert all(rate == 0.0 for _, _, rate in states.values())


async def test_a_stale_rollout_cache_is_caught_by_the_job_s_insert(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    """A process that listens for rollout changes keeps what it read; a rollout put by another
    process before its NOTIFY arrived is still seen by the create's INSERT, which makes the
    create again with its arm: no create of a rollout's type escapes it."""
    settings = make_settings(database_url, temporal_address, **fake_env(fake))
    admin = auth(settings, "root", admin=True)
    async with (
        engine_stack(settings, temporal_client, queues=(), relay=False) as stack,
        api_client(settings) as (_, c),
    ):
        book = stack.service.creation.rollouts
        book.listening = True
        assert await book.current(FLASH) is None  # kept: no rollout
        arms = [{"name": "only", "promptVersion": f"{FLASH}.v2", "weight": 100}]
        assert (await c.put(ROLLOUT, json={"arms": arms}, headers=admin)).status_code == 200
        job_id = await stack.create("u-stale", job_type=FLASH, input=INPUTS[FLASH])
        row = await stack.job(job_id)
        assert (row.rollout_arm, row.prompt_version) == ("only", f"{FLASH}.v2")
        # Without a rollout again, the kept one is dropped the same way.
        assert (await c.delete(ROLLOUT, headers=admin)).status_code == 204
        again = await stack.job(await stack.create("u-stale", job_type=FLASH, input=INPUTS[FLASH]))
        assert again.rollout_arm is None and again.rollout_id is None
