"""Wiring of recurring jobs in a worker process: the run activities' service (the API's own
create path: same catalog, same create policy, same credential lookup, not internal), their
worker on the `ai-schedules` task queue, and the sync the reconciler's repair uses."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker, WorkflowRunner

from activities.failures import PublicFailureInterceptor
from activities.schedules import ScheduleActivities
from db.credentials import active_user_key_id
from jobs.schedule_dispatch import CATCHUP_WINDOW_S, ScheduleSync
from jobs.schedules import SchedulePolicy, ScheduleService
from jobs.service import JobService
from runtime.wiring import Parts, create_policy
from workflows.schedule_run import ScheduledRun

# The `ai-schedules` worker's slots: runs at once (each a create), waits for a run's job (a
# short read each), workflow tasks. Its own, so a backlog of runs never takes the relay's or
# the reconciler's slots on `ai-system`.
RUN_SLOTS = 4


def schedule_activities(parts: Parts) -> ScheduleActivities:
    s = parts.settings
    jobs = JobService(
        parts.sessionmaker, parts.catalog, create_policy(s), credential_lookup=active_user_key_id
    )
    return ScheduleActivities(
        ScheduleService(parts.sessionmaker, jobs, SchedulePolicy.from_settings(s))
    )


def schedule_sync(client: Client, parts: Parts) -> ScheduleSync:
    s = parts.settings
    return ScheduleSync(
        parts.sessionmaker,
        client,
        suffix=s.task_queue_suffix,
        catchup_s=CATCHUP_WINDOW_S,
    )


def schedules_worker(
    client: Client, parts: Parts, runner: WorkflowRunner, *, drain_s: float
) -> Worker:
    """`ScheduledRun` and its activities on `ai-schedules`, in the `ai-system` process: slots
    of its own (RUN_SLOTS), so that however many runs wait, the relay, the reconciler and the
    bulk operations on `ai-system` never wait behind them."""
    return Worker(
        client,
        task_queue=schedule_sync(client, parts).queue,
        workflows=[ScheduledRun],
        activities=schedule_activities(parts).all(),
        max_concurrent_activities=RUN_SLOTS,
        max_concurrent_local_activities=RUN_SLOTS,
        max_concurrent_workflow_tasks=RUN_SLOTS,
        # A run cut by the stop is retried on another worker (its key makes one job).
        graceful_shutdown_timeout=timedelta(seconds=drain_s),
        workflow_runner=runner,
        interceptors=[PublicFailureInterceptor()],
    )
