"""The bare workflows the bench measures the engine against; no database, no-op bodies.

- `BenchNoopWorkflow`: one regular activity (`bench_noop`), the smallest job a worker can run.
- `BenchShapeWorkflow`: the engine job workflow's shape (workflows/job_workflow.py) and nothing
  else: four local activities and one regular one, in the engine's order (prepare, resolve,
  execute, project, complete) and with the engine's timeouts, retry policies and cancellation
  type, so engine ÷ this baseline is what the stages' work costs, not the number of stages.

The worker (`bench/baseline.py`) runs these in the default sandbox without passing this module
through, as the engine's worker re-imports its workflow module in each run's sandbox: keep the
imports here to the standard library and temporalio.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

NOOP_WORKFLOW = "BenchNoopWorkflow"
NOOP_ACTIVITY = "bench_noop"
SHAPE_WORKFLOW = "BenchShapeWorkflow"
SHAPE_STAGES = ("prepare", "resolve", "execute", "project", "complete")

# The engine's bookkeeping-stage options (workflows/job_workflow.py: LOCAL_TIMEOUT,
# BOOKKEEPING_RETRY) and the synthetic job's EXECUTE options (timeoutMs 30 s + 15 s).
_LOCAL_TIMEOUT = timedelta(seconds=30)
_LOCAL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,
)
_EXECUTE_TIMEOUT = timedelta(seconds=45)
_EXECUTE_HEARTBEAT = timedelta(seconds=30)
_EXECUTE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_attempts=3,
    non_retryable_error_types=["INVALID_OUTPUT", "CANCELLED"],
)


@activity.defn(name=NOOP_ACTIVITY)
async def noop() -> None:
    return None


@workflow.defn(name=NOOP_WORKFLOW)
class NoopWorkflow:
    @workflow.run
    async def run(self) -> None:
        await workflow.execute_activity(NOOP_ACTIVITY, start_to_close_timeout=timedelta(seconds=30))


@activity.defn(name="bench_prepare")
async def prepare(job_id: str) -> str:
    return job_id


@activity.defn(name="bench_resolve")
async def resolve(job_id: str) -> str:
    return job_id


@activity.defn(name="bench_execute")
async def execute(job_id: str) -> str:
    return job_id


@activity.defn(name="bench_project")
async def project(job_id: str) -> str:
    return job_id


@activity.defn(name="bench_complete")
async def complete(job_id: str) -> str:
    return job_id


SHAPE_ACTIVITIES = (prepare, resolve, execute, project, complete)


@workflow.defn(name=SHAPE_WORKFLOW)
class ShapeWorkflow:
    """prepare, resolve (local) → execute (regular, the slot) → project, complete (local)."""

    @workflow.run
    async def run(self, job_id: str) -> str:
        for stage in (prepare, resolve):
            await self._local(stage, job_id)
        await workflow.execute_activity(
            execute,
            job_id,
            start_to_close_timeout=_EXECUTE_TIMEOUT,
            heartbeat_timeout=_EXECUTE_HEARTBEAT,
            retry_policy=_EXECUTE_RETRY,
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        for stage in (project, complete):
            await self._local(stage, job_id)
        return job_id

    @staticmethod
    async def _local(stage: Callable[[str], Awaitable[str]], job_id: str) -> str:
        return await workflow.execute_local_activity(
            stage,
            job_id,
            start_to_close_timeout=_LOCAL_TIMEOUT,
            retry_policy=_LOCAL_RETRY,
        )
