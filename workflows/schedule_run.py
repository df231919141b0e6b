"""`ScheduledRun`: one run of a user's schedule, on the `ai-schedules` queue (its activities
inherit it: slots of their own in the `ai-system` process).

Started by the Temporal schedule at each fire (workflow id: the schedule's action id, which
contains the scheduleId, plus the scheduled time, added by Temporal) or by `/trigger` (id from
the schedule id and the trigger's time). One activity takes a request from the owner's API rate
and creates the job through the API's create path with the key (schedule, scheduled time), so a
retried or duplicated run makes one job, and records the run. If a job was created, the
workflow then waits for it to end (a local activity reads its state, on a timer backing off to a
minute), so the schedule's overlap policy applies to the jobs: `skip` fires nothing while the
previous run's job is still running.

Payloads are ids, times, codes: never the schedule's input or owner.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy, SearchAttributeKey

from workflows.stages import stub

with workflow.unsafe.imports_passed_through():
    from engine.schedules import (
        SCHEDULE_RUN_WORKFLOW,
        ScheduledRunInput,
        ScheduledRunResult,
        ScheduleRunRequest,
        iso,
    )

SCHEDULED_START = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")
_LONGEST_WAIT = timedelta(minutes=1)


# Typed stubs of its activities (as workflows/stages.py's; activities/schedules.py registers
# them).
@activity.defn
async def schedule_run(req: ScheduleRunRequest) -> ScheduledRunResult:
    stub()


@activity.defn
async def schedule_job_ended(job_id: str) -> bool:
    stub()


@workflow.defn(name=SCHEDULE_RUN_WORKFLOW)
class ScheduledRun:
    @workflow.run
    async def run(self, inp: ScheduledRunInput) -> ScheduledRunResult:
        at = inp.manual_at
        if at is None:
            fired = workflow.info().typed_search_attributes.get(SCHEDULED_START)
            at = iso(fired if fired is not None else workflow.now())
        result = await workflow.execute_activity(
            schedule_run,
            ScheduleRunRequest(inp.schedule_id, at, manual=inp.manual_at is not None),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30), maximum_attempts=20),
        )
        if result.job_id is None:
            return result
        wait = timedelta(seconds=1)
        while True:
            ended = await workflow.execute_local_activity(
                schedule_job_ended,
                result.job_id,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
            )
            if ended:
                return result
            await workflow.sleep(wait)
            wait = min(wait * 2, _LONGEST_WAIT)
