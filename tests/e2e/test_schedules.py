"""Recurring jobs over real HTTP, PostgreSQL and Temporal: a 2-second schedule whose jobs run
and succeed, pause (no new runs), trigger (one run now, even while paused), ownership (404 for
another user, admins see and pause anyone's), invalid specs (422), delete (the Temporal schedule
goes with the row) and a schedule whose owner is over quota (runs recorded as refused).

Each test runs a dedicated API, an `ai-interactive` and an `ai-system` worker, the relay and the
schedules' dispatcher, all on one task queue suffix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client, ScheduleOverlapPolicy
from temporalio.service import RPCError, RPCStatusCode

import jobs.schedules
from activities.webhooks import WebhookConfig, WebhookDeliverer
from db.session import SessionMaker
from engine.definition import SYSTEM_QUEUE
from engine.schedules import RUN_REFUSED, temporal_schedule_id
from jobs.credentials import credential_cipher
from runtime.schedules import schedule_dispatcher
from tests.e2e.conftest import Api, assert_problem, start_api
from tests.job_data import INPUTS
from tests.stack import INTERACTIVE, Stack, engine_stack
from tests.support import eventually
from tests.webhook_helpers import receiver, running, verified_by

BASE = "/api/ai/schedules"
WEBHOOK_CONFIG = WebhookConfig(allow_private=True, poll_interval_s=0.05, request_timeout_s=3.0)


@contextlib.asynccontextmanager
async def scheduling(
    env: Any, client: Client, **overrides: Any
) -> AsyncIterator[tuple[Api, Stack]]:
    settings = env(SCHEDULE_MIN_INTERVAL_S=2, **overrides)
    async with engine_stack(settings, client, queues=(*INTERACTIVE, SYSTEM_QUEUE)) as st:
        stop = asyncio.Event()
        loop = asyncio.create_task(schedule_dispatcher(client, st.parts, poll_s=0.2).run(stop))
        try:
            async with start_api(settings, temporal=client) as api:
                yield api, st
        finally:
            stop.set()
            await asyncio.wait_for(loop, 10)


async def create(api: Api, user: str = "alice", **body: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"jobType": "synthetic", "input": {}, **body}
    r = await api.http.post(BASE, json=payload, headers=api.as_user(user))
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


async def get(api: Api, sid: str, user: str = "alice") -> dict[str, Any]:
    r = await api.http.get(f"{BASE}/{sid}", headers=api.as_user(user))
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def runs_at_least(api: Api, sid: str, n: int, timeout: float = 20.0) -> list[Any]:
    async def enough() -> list[Any] | None:
        runs: list[Any] = (await get(api, sid))["recentRuns"]
        return runs if len(runs) >= n else None

    return await eventually(enough, timeout=timeout, interval=0.2, what=f"{n} runs of {sid}")


async def temporal_schedule(client: Client, st: Stack, sid: str) -> Any:
    """Its Temporal schedule, once the dispatcher has created it (the API's own dispatch may
    have found the command already claimed by the loop, still at work)."""
    handle = client.get_schedule_handle(temporal_schedule_id(sid, st.settings.task_queue_suffix))

    async def described() -> Any:
        try:
            return await handle.describe()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            return None

    return await eventually(described, timeout=10, interval=0.1, what=f"schedule {sid}")


async def test_a_two_second_schedule_runs_jobs_that_succeed(
    db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    async with scheduling(env, temporal_client) as (api, st):
        s = await create(api, intervalSeconds=2)
        sid = s["scheduleId"]
        assert s["nextRunAt"] is not None and s["overlap"] == "skip" and not s["paused"]
        desc = await temporal_schedule(temporal_client, st, sid)
        assert sid in desc.id
        assert desc.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
        runs = await runs_at_least(api, sid, 2, timeout=15)
        for run in runs:
            assert run["errorCode"] is None and run["jobId"] is not None
            job = await api.wait_status(run["jobId"], "succeeded", timeout=20)
            assert job["jobType"] == "synthetic"


async def test_pause_stops_runs_and_trigger_runs_once_even_while_paused(
    db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    async with scheduling(env, temporal_client) as (api, st):
        sid = (await create(api, intervalSeconds=2))["scheduleId"]
        await runs_at_least(api, sid, 1, timeout=15)
        r = await api.http.post(f"{BASE}/{sid}/pause", headers=api.as_user())
        assert r.status_code == 200 and r.json()["paused"] and r.json()["nextRunAt"] is None
        after_pause = len((await get(api, sid))["recentRuns"])

        async def paused_in_temporal() -> bool:
            return bool((await temporal_schedule(temporal_client, st, sid)).schedule.state.paused)

        await eventually(paused_in_temporal, timeout=10, interval=0.1, what="Temporal's pause")
        await asyncio.sleep(5)
        # At most one run already under way when the pause answered may still land.
        assert len((await get(api, sid))["recentRuns"]) <= after_pause + 1
        paused_count = len((await get(api, sid))["recentRuns"])
        r = await api.http.post(f"{BASE}/{sid}/trigger", headers=api.as_user())
        assert r.status_code == 202, r.text
        runs = await runs_at_least(api, sid, paused_count + 1)
        assert runs[0]["jobId"] is not None
        await asyncio.sleep(1)
        assert len((await get(api, sid))["recentRuns"]) == paused_count + 1
        r = await api.http.post(f"{BASE}/{sid}/resume", headers=api.as_user())
        assert r.status_code == 200 and not r.json()["paused"] and r.json()["nextRunAt"]


async def test_trigger_right_after_a_paused_create(
    db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    async with scheduling(env, temporal_client) as (api, _):
        sid = (await create(api, cron="0 3 * * MON", timezone="Europe/Paris", paused=True))[
            "scheduleId"
        ]
        r = await api.http.post(f"{BASE}/{sid}/trigger", headers=api.as_user())
        assert r.status_code == 202, r.text
        (run,) = await runs_at_least(api, sid, 1)
        assert run["jobId"] is not None
        await api.wait_status(run["jobId"], "succeeded")


async def test_another_users_schedule_is_not_found_and_admins_see_all(
    db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    async with scheduling(env, temporal_client) as (api, _):
        sid = (await create(api, intervalSeconds=3600))["scheduleId"]
        bob = api.as_user("bob")
        assert_problem(await api.http.get(f"{BASE}/{sid}", headers=bob), 404, "SCHEDULE_NOT_FOUND")
        for action in ("pause", "resume", "trigger"):
            r = await api.http.post(f"{BASE}/{sid}/{action}", headers=bob)
            assert_problem(r, 404, "SCHEDULE_NOT_FOUND")
        assert_problem(
            await api.http.delete(f"{BASE}/{sid}", headers=bob), 404, "SCHEDULE_NOT_FOUND"
        )
        assert (await api.http.get(BASE, headers=bob)).json()["items"] == []
        mine = (await api.http.get(BASE, headers=api.as_user())).json()["items"]
        assert [x["scheduleId"] for x in mine] == [sid]
        r = await api.http.get("/admin-api/ai/schedules", headers=api.as_admin())
        assert [x["scheduleId"] for x in r.json()["items"]] == [sid]
        r = await api.http.get(f"{BASE}/{sid}", headers=api.as_admin())
        assert r.status_code == 200 and r.json()["userId"] == "alice"
        r = await api.http.post(f"/admin-api/ai/schedules/{sid}/pause", headers=api.as_admin())
        assert r.status_code == 200 and r.json()["paused"]
        assert (await api.http.get("/admin-api/ai/schedules", headers=bob)).status_code == 403
        r = await api.http.post(
            f"/admin-api/ai/schedules/{uuid.uuid4()}/pause", headers=api.as_admin()
        )
        assert_problem(r, 404, "SCHEDULE_NOT_FOUND")


@pytest.mark.parametrize(
    "body",
    [
        {"cron": "61 * * * *"},
        {"cron": "not a cron"},
        {"cron": "0 * * * *", "timezone": "Mars/Olympus"},
        {"intervalSeconds": 1},
        {"intervalSeconds": 60, "cron": "0 * * * *"},
        {},
        {"intervalSeconds": 60, "jobType": "no_such_type"},
        {"intervalSeconds": 60, "overlap": "sometimes"},
    ],
)
async def test_invalid_schedules_are_422(
    db: SessionMaker, env: Any, temporal_client: Client, body: dict[str, Any]
) -> None:
    async with scheduling(env, temporal_client) as (api, _):
        payload = {"jobType": "synthetic", "input": {}, **body}
        r = await api.http.post(BASE, json=payload, headers=api.as_user())
        assert r.status_code == 422, r.text


async def test_per_user_cap(
    db: SessionMaker, env: Any, temporal_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs.schedules, "MAX_PER_USER", 1)
    async with scheduling(env, temporal_client) as (api, _):
        await create(api, intervalSeconds=3600)
        r = await api.http.post(
            BASE, json={"jobType": "synthetic", "intervalSeconds": 3600}, headers=api.as_user()
        )
        assert_problem(r, 409, "SCHEDULE_LIMIT_REACHED")
        await create(api, "bob", intervalSeconds=3600)


async def test_delete_removes_the_temporal_schedule(
    db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    async with scheduling(env, temporal_client) as (api, st):
        sid = (await create(api, intervalSeconds=3600))["scheduleId"]
        await temporal_schedule(temporal_client, st, sid)
        r = await api.http.delete(f"{BASE}/{sid}", headers=api.as_user())
        assert r.status_code == 204
        assert_problem(
            await api.http.get(f"{BASE}/{sid}", headers=api.as_user()), 404, "SCHEDULE_NOT_FOUND"
        )

        handle = temporal_client.get_schedule_handle(
            temporal_schedule_id(sid, st.settings.task_queue_suffix)
        )

        async def gone() -> bool:
            try:
                await handle.describe()
            except RPCError as exc:
                return exc.status == RPCStatusCode.NOT_FOUND
            return False

        await eventually(gone, timeout=10, interval=0.2, what="the Temporal schedule to go")


async def test_runs_of_an_owner_over_quota_are_recorded_as_refused(
    db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    async with scheduling(env, temporal_client, QUOTA_MAX_JOBS_PER_DAY=1) as (api, _):
        sid = (await create(api, intervalSeconds=2))["scheduleId"]
        runs = await runs_at_least(api, sid, 3, timeout=20)
        assert [r["errorCode"] for r in runs[:2]] == ["QUOTA_EXCEEDED", "QUOTA_EXCEEDED"]
        assert all(r["jobId"] is None for r in runs[:2])
        assert sum(r["jobId"] is not None for r in runs) == 1
        async with db() as s:
            events = (
                await s.execute(
                    text("SELECT count(*) FROM outbox_event WHERE event_type = :t"),
                    {"t": RUN_REFUSED},
                )
            ).scalar_one()
        assert events >= 2


async def test_a_refused_run_is_delivered_as_a_webhook_to_subscribers(
    db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    async with scheduling(env, temporal_client, QUOTA_MAX_JOBS_PER_DAY=1) as (api, st):
        deliverer = WebhookDeliverer(
            st.parts.sessionmaker, credential_cipher(st.settings), WEBHOOK_CONFIG
        )
        with receiver() as rec:
            r = await api.http.post(
                "/api/ai/webhooks",
                json={"url": rec.url, "eventTypes": [RUN_REFUSED]},
                headers=api.as_user(),
            )
            assert r.status_code == 201, r.text
            secret = r.json()["secret"]
            async with running(deliverer):
                sid = (await create(api, cron="0 3 * * MON", paused=True))["scheduleId"]
                for _ in range(2):
                    r = await api.http.post(f"{BASE}/{sid}/trigger", headers=api.as_user())
                    assert r.status_code == 202
                    await runs_at_least(api, sid, _ + 1)
                [req] = await rec.wait_for(1)
        assert verified_by(secret, req)
        body = json.loads(req.body)
        assert body["type"] == RUN_REFUSED
        assert body["data"] == {
            "scheduleId": sid,
            "scheduledAt": body["data"]["scheduledAt"],
            "errorCode": "QUOTA_EXCEEDED",
        }
        runs = (await get(api, sid))["recentRuns"]
        assert [x["errorCode"] for x in runs] == ["QUOTA_EXCEEDED", None]


async def test_a_lost_temporal_schedule_is_created_again_from_its_row(
    db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    async with scheduling(env, temporal_client) as (api, st):
        sid = (await create(api, intervalSeconds=3600, paused=True))["scheduleId"]
        await temporal_schedule(temporal_client, st, sid)
        handle = temporal_client.get_schedule_handle(
            temporal_schedule_id(sid, st.settings.task_queue_suffix)
        )
        await handle.delete()
        assert await schedule_dispatcher(temporal_client, st.parts).repair() == 1
        desc = await temporal_schedule(temporal_client, st, sid)
        assert desc.schedule.state.paused


async def test_a_run_without_the_owners_key_is_refused_with_its_code(
    db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    async with scheduling(env, temporal_client) as (api, _):
        sid = (
            await create(
                api,
                jobType="flashcard_generation",
                input=INPUTS["flashcard_generation"],
                credentialMode="user_deepseek_key",
                cron="0 3 * * *",
                paused=True,
            )
        )["scheduleId"]
        assert (await get(api, sid))["credentialMode"] == "user_deepseek_key"
        r = await api.http.post(f"{BASE}/{sid}/trigger", headers=api.as_user())
        assert r.status_code == 202
        (run,) = await runs_at_least(api, sid, 1)
        assert run["jobId"] is None and run["errorCode"] == "CREDENTIAL_MISSING"
