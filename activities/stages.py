"""The job stages as Temporal activities, built once per worker:

    PREPARE   (local)  the execution plan from the job type's definition; no SQL
    EXECUTE            the provider call: the CAS queued → running, one paid call per attempt,
                       heartbeats, cancellation, validation, the stored output
    PROJECT   (local)  projector + markSucceeded + ai.job.completed, one transaction
    finalizers (local) the job's one `failed` or `cancelled`

EXECUTE lives in `activities/execute.py`, the others in `activities/bookkeeping.py`, what they
share (configuration, failure rules) in `activities/stage_support.py`.
"""

from __future__ import annotations

from typing import Any

from activities.bookkeeping import BookkeepingStages
from activities.execute import ExecuteStage
from activities.stage_support import EngineConfig


class JobActivities(BookkeepingStages, ExecuteStage):
    def all(self) -> list[Any]:
        return [
            self.prepare,
            self.resolve,
            self.execute,
            self.project,
            self.complete,
            self.finalize_failed,
            self.finalize_cancelled,
        ]


__all__ = ["EngineConfig", "JobActivities"]
