"""The job stages of one worker, each an object built from the same `StageDeps`:

    prepare            (local)  `activities/prepare.py`   the plan; a job no longer queued stops
    resolve            (local)  `activities/resolve.py`   snapshot, key, prompt, provider, limits
    execute                     `activities/execute.py`   the provider call, in a worker slot
    project            (local)  `activities/project.py`   projector + succeeded, one transaction
    complete           (local)  `activities/complete.py`  the usage summary
    merge              (local)  `activities/merge.py`     a long source's chunks, one output
    reuse              (local)  `activities/reuse.py`     another job's answer, instead of execute
    finalize_failed,   (local)  `activities/finalize.py`  the job's one `failed` / `cancelled`
    finalize_cancelled
    flow_expire        (local)  `activities/flow.py`      a start-by time or deadline reached
    batch_enroll,      (local)  `activities/batch_job.py` a batch-tier job's stages instead of
    batch_collect,                                       execute: its batch's item, its answer,
    batch_leave                                          its leaving on a cancel

The activity names are the constants of `engine/contracts.py`; the workflow calls them through
the typed stubs of `workflows/stages.py`. How a stage fails is `activities/failures.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.batch_job import BatchJob
from activities.complete import Complete
from activities.deps import EngineConfig, SignalAll, StageDeps
from activities.execute import Execute
from activities.finalize import Finalize
from activities.flow import FlowStage
from activities.merge import Merge
from activities.metrics import WorkerMetrics, worker_metrics
from activities.prepare import Prepare
from activities.project import Project
from activities.resolve import Resolve
from activities.reuse import Reuse
from db.session import SessionMaker
from jobs.gateway import Gateway
from jobs.spec import Catalog


class JobActivities:
    """The stages a job worker registers, built once from their dependencies. Each attribute
    is a stage's `@activity.defn` method, bound to its own stage object."""

    def __init__(
        self,
        sessionmaker: SessionMaker,
        catalog: Catalog,
        gateway: Gateway,
        config: EngineConfig | None = None,
        metrics: WorkerMetrics | None = None,
        *,
        signal_all: SignalAll | None = None,
    ) -> None:
        self.deps = StageDeps(
            sessionmaker,
            catalog,
            gateway,
            config=config or EngineConfig(),
            metrics=metrics or worker_metrics(),
            signal_all=signal_all,
        )
        finalize = Finalize(self.deps)
        self.prepare = Prepare(self.deps).prepare
        self.resolve = Resolve(self.deps).resolve
        self.execute = Execute(self.deps).execute
        self.project = Project(self.deps).project
        self.complete = Complete(self.deps).complete
        self.merge = Merge(self.deps).merge
        self.reuse = Reuse(self.deps).reuse
        self.finalize_failed = finalize.finalize_failed
        self.finalize_cancelled = finalize.finalize_cancelled
        self.flow_expire = FlowStage(self.deps).flow_expire
        self.batch = BatchJob(self.deps)  # a batch-tier job's stages (activities/batch_job.py)

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.prepare,
            self.resolve,
            self.execute,
            self.project,
            self.complete,
            self.merge,
            self.reuse,
            self.finalize_failed,
            self.finalize_cancelled,
            self.flow_expire,
            *self.batch.all(),
        ]


__all__ = ["EngineConfig", "JobActivities", "StageDeps"]
