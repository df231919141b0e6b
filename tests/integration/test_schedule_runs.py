"""A schedule's run against its owner's API rate, on the real PostgreSQL: each run takes one
request (a refused one is recorded `RATE_LIMITED` with its event, and makes no job), and a
retried run takes nothing more: neither after its outcome was recorded nor in the window
between its job's create and that record (a crash there must not turn a made job into a
refused run)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio.client import Client

from db.session import SessionMaker
from engine.schedules import RUN_REFUSED, Spec
from engine.settings import Settings
from jobs.schedules import NewSchedule, SchedulePolicy, ScheduleService
from tests.integration.engine_helpers import execute, rows, scalar
from tests.stack import engine_stack


async def test_each_run_takes_one_request_and_a_retry_takes_none(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        # A burst of one request, refilled once a minute: the first run takes it.
        svc = ScheduleService(db, st.service, SchedulePolicy(60, 20, 1, 1))
        row = await svc.create(NewSchedule("u1", "synthetic", {}, Spec(3600, None), paused=True))
        first = datetime(2026, 1, 1, 9, tzinfo=UTC)
        made = await svc.run(row.id, first, manual=True)
        assert made.outcome == "created" and made.job_id is not None
        # Its retry, after the record and (the run row gone) before it: the same job.
        assert await svc.run(row.id, first, manual=True) == made
        await execute(db, "DELETE FROM ai_schedule_run")
        assert await svc.run(row.id, first, manual=True) == made
        # The next run finds the bucket empty: refused, recorded, announced, no job.
        second = first + timedelta(hours=1)
        refused = await svc.run(row.id, second, manual=True)
        assert (refused.outcome, refused.error_code, refused.job_id) == (
            "refused",
            "RATE_LIMITED",
            None,
        )
        assert await svc.run(row.id, second, manual=True) == refused
        runs = await rows(
            db, "SELECT job_id, error_code FROM ai_schedule_run ORDER BY scheduled_at"
        )
        assert [(str(r.job_id), r.error_code) for r in runs] == [
            (made.job_id, None),
            ("None", "RATE_LIMITED"),
        ]
        assert await scalar(db, "SELECT count(*) FROM ai_job") == 1
        events = "SELECT count(*) FROM outbox_event WHERE event_type = :t"
        assert await scalar(db, events, t=RUN_REFUSED) == 1
