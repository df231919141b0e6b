"""A batch-tier job's EXECUTE: its attempts go through its provider's Batch API instead of a call
(the job workflow takes this branch for `service_tier == "batch"`; docs/batch.md "A batch
job's run").

Per attempt: `batch_enroll` (the job `running`, its cost covered, its item in its group's open
batch, the batch workflow started), then the wait for the `batch-result` signal (no polling and
no slot held: a workflow condition, with a long backstop timer in case a signal is lost, after
which the item is simply looked at again), then `batch_collect` (the answer validated and
stored; the same `ExecuteResult` EXECUTE returns, for PROJECT). A failed item or an invalid
answer spends the attempt, and the job enrolls again, alone, in the next batch; with no
attempts left (or a code no retry can change) it fails with that code through the usual
`finalize_failed`. A cancel (or any failure) while its item may still be live makes it leave
its batch first (`batch_leave`, shielded from a second cancel), then the usual ending.

`BatchResults` counts the signals; a wait compares with the count taken before its enroll, so a
signal that arrived meanwhile is not lost, and one left over from an earlier attempt only makes
the next look find the item still `pending`. Only ids, hashes and codes enter the history.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from workflows.limit_wait import Wakes
from workflows.stages import stub

with workflow.unsafe.imports_passed_through():
    from engine.contracts import (
        BatchAttemptInput,
        BatchCollectResult,
        BatchEnrollResult,
        BatchLeaveResult,
        ExecuteResult,
        ExecutionPlan,
        JobWorkflowInput,
    )
    from engine.errors import is_retryable, public_message_for

I = TypeVar("I")  # noqa: E741
T = TypeVar("T")

# How long a job waits for its batch's signal before it looks at its item anyway: a backstop
# for a lost signal (the batch workflow signals every job whose item ended), not a poll. Each
# look at an item still waiting also extends the job's lock (jobs/batch_job.py).
BATCH_BACKSTOP_S = 3600.0


# Typed stubs of the batch stages (as workflows/stages.py's): the activity runs under the stub's
# name, the worker registers the real one (activities/batch_job.py).
@activity.defn
async def batch_enroll(inp: BatchAttemptInput) -> BatchEnrollResult:
    stub()


@activity.defn
async def batch_collect(inp: BatchAttemptInput) -> BatchCollectResult:
    stub()


@activity.defn
async def batch_leave(inp: BatchAttemptInput) -> BatchLeaveResult:
    stub()


class BatchResults(Wakes):
    """The `batch-result` signals this run received (the job workflow counts them in a
    `Wakes` of its own: this module is imported only by a run that takes the batch branch)."""

    def arrived(self) -> None:
        self.woken()


def retry_follows(code: str, *, attempt: int, plan: ExecutionPlan) -> bool:
    """Whether a failed batch attempt is tried again (in the next batch): attempts left, and a
    code a retry can change (engine/errors.py, with the job's abort strategy)."""
    return attempt < plan.max_attempts and is_retryable(
        code, attempt=attempt, abort_strategy=plan.abort_strategy
    )


class BatchTier:
    """The batch branch of one job's run; its stages are local activities under the job
    workflow's bookkeeping `retry` and `timeout`."""

    def __init__(self, results: Wakes, retry: RetryPolicy, timeout: timedelta) -> None:
        self._results = results
        self._retry = retry
        self._timeout = timeout

    async def execute(self, inp: JobWorkflowInput, plan: ExecutionPlan) -> ExecuteResult:
        """The job's attempts through its batches, until one answer is stored (its hash, for
        PROJECT), the job ended before it joined (its state), or it fails for good (raised as
        the ApplicationError of its code, which the workflow's ending reads)."""
        attempt = inp.attemptsSpent + 1
        while True:
            arg = BatchAttemptInput(job_id=inp.jobId, attempt=attempt, timeout_ms=plan.timeout_ms)
            seen = self._results.count
            try:
                enrolled = await self._local(
                    batch_enroll,
                    arg,
                    # A cancel waits for the enroll to end: its item is committed or not before
                    # the leave below looks for it.
                    cancellation=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                )
                if not enrolled.enrolled:
                    status = enrolled.lifecycle_status
                    return ExecuteResult(enrolled.output_hash, attempt, lifecycle_status=status)
                collected = await self._collected(arg, seen)
            except BaseException:
                await self._shielded(self._local(batch_leave, arg))
                raise
            if collected.status == "succeeded":
                return ExecuteResult(output_hash=collected.output_hash, attempt=attempt)
            code = collected.error_code
            if not retry_follows(code, attempt=attempt, plan=plan):
                raise ApplicationError(public_message_for(code), type=code, non_retryable=True)
            attempt += 1

    async def _collected(self, arg: BatchAttemptInput, seen: int) -> BatchCollectResult:
        """The item's outcome: after each signal newer than `seen` (or the backstop) it is
        looked at, until it is no longer `pending`."""
        while True:
            await self._signal_after(seen)
            seen = self._results.count
            collected = await self._local(batch_collect, arg)
            if collected.status != "pending":
                return collected

    async def _signal_after(self, seen: int) -> None:
        """Until a `batch-result` signal newer than `seen`, or the backstop's end."""
        try:
            await workflow.wait_condition(
                lambda: self._results.count > seen, timeout=BATCH_BACKSTOP_S
            )
        except TimeoutError:  # asyncio.TimeoutError: the backstop's end
            pass

    async def _local(
        self,
        stage: Callable[[I], Awaitable[T]],
        arg: I,
        *,
        cancellation: workflow.ActivityCancellationType = (
            workflow.ActivityCancellationType.TRY_CANCEL
        ),
    ) -> T:
        return await workflow.execute_local_activity(
            stage,
            arg,
            start_to_close_timeout=self._timeout,
            retry_policy=self._retry,
            cancellation_type=cancellation,
        )

    @staticmethod
    async def _shielded(aw: Awaitable[T]) -> T:
        """Run the leave to completion even if the workflow is cancelled again meanwhile."""
        task = asyncio.ensure_future(aw)
        while True:
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                continue
