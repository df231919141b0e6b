"""Recurring jobs over real HTTP, PostgreSQL and Temporal: a 2-second schedule whose jobs run
and succeed, pause (no new runs), trigger (one run now, even while paused), ownership (404 for
another user, admins see and pause anyone's), invalid specs (422), delete (the Temporal schedule
goes with the row), a schedule whose owner is over quota (runs recorded as refused), the
schedule's changes as outbox events the relay publishes, the owner's API rate (the create, the
trigger and each run take from it) and the reconciler's repair.

Each test runs a dedicated API, an `ai-interactive` and an `ai-system` worker (which serves
`ai-schedules` too) and the relay, all on one task queue suffix.
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
from temporalio.client import (
    Client,
    ScheduleActionStartWorkflow,
    ScheduleOverlapPolicy,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.service import RPCError, RPCStatusCode

import jobs.schedules
from activities.reconciler import Reconciler, ReconcilerConfig
from activities.webhooks import WebhookConfig, WebhookDeliverer
from db.session import SessionMaker
from engine.definition import SYSTEM_QUEUE
from engine.schedules import (
    RUN_REFUSED,
    SCHEDULES_QUEUE,
    SYNC_EVENT,
    TRIGGER_EVENT,
    temporal_schedule_id,
)
from jobs.credentials import credential_cipher
from runtime.schedules import schedule_sync
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
    settings = env(**{"SCHEDULE_MIN_INTERVAL_S": 2, **overrides})
    async with (
        engine_stack(settings, client, queues=(*INTERACTIVE, SYSTEM_QUEUE)) as st,
        start_api(settings, temporal=client) as api,
    ):
        yield api, st


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


async def temporal_schedule_or_none(client: Client, st: Stack, sid: str) -> Any:
    handle = client.get_schedule_handle(temporal_schedule_id(sid, st.settings.task_queue_suffix))
    try:
        return await handle.describe()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        return None


async def temporal_schedule(client: Client, st: Stack, sid: str) -> Any:
    """Its Temporal schedule, once the relay has dispatched the create's sync event."""

    async def described() -> Any:
        return await temporal_schedule_or_none(client, st, sid)

    return await eventually(described, timeout=10, interval=0.1, what=f"schedule {sid}")


async def temporal_schedule_gone(client: Client, st: Stack, sid: str) -> None:
    async def gone() -> bool:
        return await temporal_schedule_or_none(client, st, sid) is None

    await eventually(gone, timeout=30, interval=0.2, what=f"schedule {sid} to go")


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
        # Runs go to their own queue, not `ai-system`'s slots.
        assert desc.schedule.action.task_queue == SCHEDULES_QUEUE + st.settings.task_queue_suffix
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
async def test_invalid_schedules_are_422(api: Api, body: dict[str, Any]) -> None:
    # A create writes its row and its outbox event only: the shared API (no workers) will do.
    payload = {"jobType": "synthetic", "input": {}, **body}
    r = await api.http.post(BASE, json=payload, headers=api.as_user())
    assert_problem(r, 422, "VALIDATION_FAILED")


async def test_the_default_minimum_interval_is_a_minute(api: Api) -> None:
    assert api.settings.schedule_min_interval_s == 60
    r = await api.http.post(
        BASE, json={"jobType": "synthetic", "intervalSeconds": 30}, headers=api.as_user()
    )
    body = assert_problem(r, 422, "VALIDATION_FAILED")
    assert [e["loc"][-1] for e in body["errors"]] == ["intervalSeconds"]
    assert "60" in body["detail"]
    await create(api, intervalSeconds=60, paused=True)


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

        await temporal_schedule_gone(temporal_client, st, sid)


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


async def test_the_reconcilers_repair_makes_temporal_match_the_rows(
    db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    """A Temporal schedule lost (deleted by hand) is created again, paused as its row says; one
    an older version made, starting its runs on `ai-system`, is moved to `ai-schedules`; one
    whose row is gone (its delete's sync parked) is deleted; a schedule that matches is left
    alone."""
    async with scheduling(env, temporal_client) as (api, st):
        lost = (await create(api, intervalSeconds=3600, paused=True))["scheduleId"]
        moved = (await create(api, intervalSeconds=3600, paused=True))["scheduleId"]
        fine = (await create(api, intervalSeconds=3600, paused=True))["scheduleId"]
        orphan = (await create(api, intervalSeconds=3600, paused=True))["scheduleId"]
        suffix = st.settings.task_queue_suffix
        for sid in (lost, moved, fine, orphan):
            await temporal_schedule(temporal_client, st, sid)
        sync = schedule_sync(temporal_client, st.parts)

        async def listed() -> bool:
            return orphan in {str(x) async for x in sync.listed()}

        # Temporal's list is eventually consistent: the repair sees what it lists.
        await eventually(listed, timeout=10, interval=0.2, what="the schedule listed")
        async with db.begin() as s:
            await s.execute(text("DELETE FROM ai_schedule WHERE id = :s"), {"s": orphan})
        await temporal_client.get_schedule_handle(temporal_schedule_id(lost, suffix)).delete()

        async def to_system_queue(u: ScheduleUpdateInput) -> ScheduleUpdate:
            assert isinstance(u.description.schedule.action, ScheduleActionStartWorkflow)
            u.description.schedule.action.task_queue = SYSTEM_QUEUE + suffix
            return ScheduleUpdate(schedule=u.description.schedule)

        await temporal_client.get_schedule_handle(temporal_schedule_id(moved, suffix)).update(
            to_system_queue
        )
        reconciler = Reconciler(
            st.parts.sessionmaker, temporal_client, ReconcilerConfig(), schedules=sync
        )
        result = await reconciler.run_once()
        assert "schedules" not in result.failed_phases
        assert sorted(d for d in result.details if d.startswith("schedule ")) == sorted(
            [f"schedule {lost} synced", f"schedule {moved} synced", f"schedule {orphan} deleted"]
        )
        assert await temporal_schedule_or_none(temporal_client, st, orphan) is None
        for sid in (lost, moved):
            desc = await temporal_schedule(temporal_client, st, sid)
            assert desc.schedule.state.paused
            assert desc.schedule.action.task_queue == SCHEDULES_QUEUE + suffix
        # A sweep starts at most every 10 minutes in a process: the next pass describes nothing.
        again = await reconciler.run_once()
        assert not [d for d in again.details if d.startswith("schedule ")]


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


async def outbox_row(api: Api, event_type: str, sid: str, status: str) -> dict[str, Any] | None:
    r = await api.http.get(
        "/admin-api/ai/outbox", params={"eventType": event_type}, headers=api.as_admin()
    )
    assert r.status_code == 200, r.text
    rows = [x for x in r.json()["items"] if x["aggregateId"] == sid]
    return rows[0] if rows and all(x["status"] == status for x in rows) else None


async def test_a_schedules_changes_are_outbox_events_the_relay_publishes(
    db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    async with scheduling(env, temporal_client) as (api, st):
        sid = (await create(api, intervalSeconds=3600, paused=True))["scheduleId"]
        r = await api.http.post(f"{BASE}/{sid}/trigger", headers=api.as_user())
        assert r.status_code == 202, r.text
        for event in (SYNC_EVENT, TRIGGER_EVENT):

            async def published(event: str = event) -> dict[str, Any] | None:
                return await outbox_row(api, event, sid, "published")

            await eventually(published, timeout=30, interval=0.2, what=f"{event} published")
        (run,) = await runs_at_least(api, sid, 1, timeout=30)
        assert run["jobId"] is not None and run["errorCode"] is None
        # The Temporal schedule followed the row (paused), and the trigger's run ran on the
        # schedules' own queue.
        desc = await temporal_schedule(temporal_client, st, sid)
        assert desc.schedule.state.paused
        async with db() as s:
            gone = (await s.execute(text("SELECT to_regclass('ai_schedule_command')"))).scalar()
        assert gone is None
        # A delete is an event too, and takes the Temporal schedule with it.
        assert (await api.http.delete(f"{BASE}/{sid}", headers=api.as_user())).status_code == 204

        await temporal_schedule_gone(temporal_client, st, sid)


async def test_the_create_the_trigger_and_each_run_take_from_the_owners_rate(
    db: SessionMaker, env: Any, temporal_client: Client
) -> None:
    limits = {"API_RATE_LIMIT_BURST": 2, "API_RATE_LIMIT_PER_MINUTE": 1}
    async with scheduling(env, temporal_client, **limits) as (api, _):
        sid = (await create(api, cron="0 3 * * MON", paused=True))["scheduleId"]
        r = await api.http.post(f"{BASE}/{sid}/trigger", headers=api.as_user())
        assert r.status_code == 202, r.text
        # The trigger was the second request of the burst; its run is the third: refused.
        (run,) = await runs_at_least(api, sid, 1, timeout=30)
        assert run == {
            "scheduledAt": run["scheduledAt"],
            "jobId": None,
            "errorCode": "RATE_LIMITED",
        }
        async with db() as s:
            jobs = (await s.execute(text("SELECT count(*) FROM ai_job"))).scalar_one()
            refused = (
                await s.execute(
                    text("SELECT count(*) FROM outbox_event WHERE event_type = :t"),
                    {"t": RUN_REFUSED},
                )
            ).scalar_one()
        assert (jobs, refused) == (0, 1)
        for action in ("trigger", "resume"):
            r = await api.http.post(f"{BASE}/{sid}/{action}", headers=api.as_user())
            assert_problem(r, 429, "RATE_LIMITED")
            assert int(r.headers["Retry-After"]) >= 1
        r = await api.http.post(
            BASE, json={"jobType": "synthetic", "cron": "0 3 * * *"}, headers=api.as_user()
        )
        assert_problem(r, 429, "RATE_LIMITED")
        # An admin's resume takes from no one's rate; a pause and a delete are never refused.
        r = await api.http.post(f"/admin-api/ai/schedules/{sid}/resume", headers=api.as_admin())
        assert r.status_code == 200 and not r.json()["paused"]
        r = await api.http.post(f"{BASE}/{sid}/pause", headers=api.as_user())
        assert r.status_code == 200 and r.json()["paused"]
        assert (await api.http.delete(f"{BASE}/{sid}", headers=api.as_user())).status_code == 204


async def test_the_openapi_document_declares_the_rate_limit_on_create_resume_and_trigger(
    api: Api,
) -> None:
    paths = (await api.http.get("/openapi.json")).json()["paths"]
    assert "429" in paths[BASE]["post"]["responses"]
    for action in ("resume", "trigger"):
        assert "429" in paths[f"{BASE}/{{scheduleId}}/{action}"]["post"]["responses"]
    for action in ("pause",):
        assert "429" not in paths[f"{BASE}/{{scheduleId}}/{action}"]["post"]["responses"]
    assert "429" not in paths[f"{BASE}/{{scheduleId}}"]["delete"]["responses"]
