"""The activities of `ScheduledRun` (workflows/schedule_run.py), on the `ai-schedules` queue:
thin adapters over `ScheduleService` (jobs/schedules.py), which owns what a run does."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from temporalio import activity

from engine.schedules import (
    SCHEDULE_JOB_ENDED,
    SCHEDULE_RUN_ACTIVITY,
    ScheduledRunResult,
    ScheduleRunRequest,
)
from jobs.schedules import ScheduleService


class ScheduleActivities:
    def __init__(self, service: ScheduleService) -> None:
        self._service = service

    @activity.defn(name=SCHEDULE_RUN_ACTIVITY)
    async def run(self, req: ScheduleRunRequest) -> ScheduledRunResult:
        """Idempotent: the job's key and the run's row are both (schedule, scheduled time)."""
        at = datetime.fromisoformat(req.scheduled_at.replace("Z", "+00:00"))
        return await self._service.run(uuid.UUID(req.schedule_id), at, manual=req.manual)

    @activity.defn(name=SCHEDULE_JOB_ENDED)
    async def job_ended(self, job_id: str) -> bool:
        return await self._service.job_ended(uuid.UUID(job_id))

    def all(self) -> list[Any]:
        return [self.run, self.job_ended]
