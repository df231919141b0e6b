"""Wiring of recurring jobs in a worker process: the run activities' service (the API's own
create path: same catalog, same create policy, same credential lookup, not internal) and the
schedules' outbox dispatcher."""

from __future__ import annotations

from temporalio.client import Client

from activities.schedules import ScheduleActivities
from db.credentials import active_user_key_id
from jobs.schedule_dispatch import POLL_S, ScheduleDispatcher
from jobs.schedules import SchedulePolicy, ScheduleService
from jobs.service import JobService
from runtime.wiring import Parts, create_policy


def schedule_activities(parts: Parts) -> ScheduleActivities:
    s = parts.settings
    jobs = JobService(
        parts.sessionmaker, parts.catalog, create_policy(s), credential_lookup=active_user_key_id
    )
    return ScheduleActivities(
        ScheduleService(parts.sessionmaker, jobs, SchedulePolicy.from_settings(s))
    )


def schedule_dispatcher(client: Client, parts: Parts, poll_s: float = POLL_S) -> ScheduleDispatcher:
    return ScheduleDispatcher(parts.sessionmaker, client, parts.settings, poll_s)
