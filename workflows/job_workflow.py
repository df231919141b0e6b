"""The job workflow: one class for every job type (the workflow type is the job type's name).
A new job runs the five stages, prepare, resolve, execute, project, complete, each an activity
under its own name, then finalize_failed or finalize_cancelled when it does not succeed; only
ids, hashes, names and codes pass through. The stages are docs/architecture.md; a change to
the commands it issues is docs/versioning.md's business."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import (
    ApplicationError,
    CancelledError,
    FailureError,
)

from workflows import stages
from workflows.failures import HistoryFull, error_code, is_cancellation
from workflows.limit_wait import Wakes, wait_for_room

with workflow.unsafe.imports_passed_through():
    from engine import contracts
    from engine.contracts import (
        CompleteInput,
        CompleteResult,
        ExecuteInput,
        ExecuteResult,
        ExecutionPlan,
        FinalizeFailedInput,
        FinalizeResult,
        JobWorkflowInput,
        JobWorkflowResult,
        ProjectInput,
        ResolveResult,
        StageInput,
    )
    from engine.errors import non_retryable_codes, public_message_for
    from engine.flow import OPERATOR_PAUSE
    from engine.lifecycle import LifecycleStatus
    from engine.limit_wait import LIMIT_WAKE_SIGNAL
    from engine.offpeak import GATE_REASON as OFFPEAK_GATE
    from engine.search_attributes import LIFECYCLE_STATUS as LIFECYCLE
    from engine.tiers import BATCH, BATCH_RESULT_SIGNAL, REUSE_SOURCE_ENDED_SIGNAL

I = TypeVar("I")  # noqa: E741
T = TypeVar("T")

SUCCEEDED = LifecycleStatus.SUCCEEDED.value
FAILED = LifecycleStatus.FAILED.value
CANCELLED = LifecycleStatus.CANCELLED.value

# Bookkeeping stages retry until PostgreSQL answers again (a database restart must not lose a
# job); domain errors are raised non-retryable by the activities themselves.
BOOKKEEPING_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,
)

LOCAL_TIMEOUT = timedelta(seconds=30)


@contextmanager
def _branch_import() -> Iterator[None]:
    """Around the import of a branch's module (start-by time and deadline, reuse, off-peak
    hold, batch tier, long-source fan-out) where the branch is taken: the sandbox re-imports
    every module this one imports at each run, so a plain job's run skips the modules it never
    runs, while a run that takes a branch imports its module into its own sandbox, checked as
    before (silently: importing in the middle of a run is the intent here)."""
    with workflow.unsafe.sandbox_import_notification_policy(
        workflow.SandboxImportNotificationPolicy.SILENT
    ):
        yield


# Between two looks at a closed gate the wait grows (2, 4, 8 s...) up to this cap, unless the
# gate named a longer one (a Retry-After, a breaker's cooldown): a long outage costs each job a
# few events a minute, and a reopened gate is seen within the cap.
GATE_WAIT_CAP_S = 15.0


class JobStages:
    """The job workflow's logic; `JobWorkflow` registers it for every job type."""

    def __init__(
        self,
        wakes: Wakes | None = None,
        ends: Wakes | None = None,
        batch: Wakes | None = None,
    ) -> None:
        self._wakes = wakes or Wakes()
        self._ends = ends or Wakes()  # a reused answer's source ended (workflows/reuse_wait.py)
        self._batch = batch or Wakes()  # `batch-result` signals (workflows/batch_tier.py)

    async def execute_job(self, inp: JobWorkflowInput) -> JobWorkflowResult:
        """PREPARE, RESOLVE, EXECUTE (through the provider gate), PROJECT, COMPLETE. The
        LifecycleStatus search attribute is upserted once, with the status the run ends with
        (the one status a Temporal UI query by status needs; `running` is PostgreSQL's; the
        relay's start set JobId, JobType and `queued`)."""
        stage = StageInput(job_id=inp.jobId, workflow_id=workflow.info().workflow_id)
        try:
            prep = await self._local(stages.prepare, stage)
            if not prep.run or prep.plan is None:
                # Cancelled while queued (or already ended): nothing runs.
                self._set_status(prep.lifecycle_status)
                return JobWorkflowResult(inp.jobId, prep.lifecycle_status)
            if prep.expires_at or prep.deadline:  # a start-by time or deadline: a durable timer
                with _branch_import():
                    from workflows import flow_guard
                return await flow_guard.guarded(
                    self._stages(inp, stage, prep.plan), prep, inp.jobId, self._local
                )
            return await self._stages(inp, stage, prep.plan)
        # A failed local activity (PREPARE, RESOLVE, PROJECT...) surfaces as its own
        # ApplicationError, not wrapped in ActivityError: catch every Temporal failure here, or
        # the workflow fails without finalizing and the job stays `running`.
        except (FailureError, asyncio.CancelledError) as err:
            return await self._finalize(inp, stage, err)

    async def _stages(
        self, inp: JobWorkflowInput, stage: StageInput, plan: ExecutionPlan
    ) -> JobWorkflowResult:
        """Everything after PREPARE: the wait for `runAt`, RESOLVE, the calls (or a reuse, a
        hold, a batch), PROJECT and COMPLETE; a failure or cancel goes to the caller."""
        if inp.runAt:
            # A run started before its runAt (the relay dispatches a delayed job at its time
            # and passes no runAt; only a row dispatched early carries one): queued on a timer,
            # no slot held; a cancel ends it at once (finalized by the caller).
            wait_s = (datetime.fromisoformat(inp.runAt) - workflow.now()).total_seconds()
            if wait_s > 0:
                await workflow.sleep(wait_s)
        resolved = await self._local(stages.resolve, stage)
        executed: ExecuteResult | None = None  # None: its own call
        if resolved.reuses:
            with _branch_import():
                from workflows.reuse_wait import reused
            executed = await reused(inp, resolved, self._ends, self._local)
        if executed is None and resolved.offpeak is not None:
            with _branch_import():
                from workflows import offpeak_hold
            await offpeak_hold.hold(resolved.offpeak)  # queued until its window (or deadline)
        if executed is None:
            executed = await self._run(inp, plan, resolved)
        if executed.fallback:  # models and a reason
            workflow.upsert_memo({"fallback": executed.fallback})
        if executed.lifecycle_status is not None:
            # The job ended before it ran (cancelled while it waited for a slot).
            self._set_status(executed.lifecycle_status)
            return JobWorkflowResult(inp.jobId, executed.lifecycle_status)
        projected = await self._local(
            stages.project, ProjectInput(job_id=inp.jobId, output_hash=executed.output_hash)
        )
        if projected.lifecycle_status != SUCCEEDED:
            self._set_status(projected.lifecycle_status)
            return JobWorkflowResult(inp.jobId, projected.lifecycle_status)
        # COMPLETE reports the usage PROJECT summed in the transaction that ended the job
        # (no read of its own); the status is upserted with the run's last commands.
        usage = (
            CompleteResult(
                calls=projected.calls,
                tokens_in=projected.tokens_in,
                tokens_out=projected.tokens_out,
                cost_micros=projected.cost_micros,
            )
            if projected.summarized
            else None
        )
        await self._local(stages.complete, CompleteInput(job_id=inp.jobId, usage=usage))
        self._set_status(SUCCEEDED)
        return JobWorkflowResult(inp.jobId, SUCCEEDED, output_hash=executed.output_hash)

    async def _run(
        self, inp: JobWorkflowInput, plan: ExecutionPlan, resolved: ResolveResult
    ) -> ExecuteResult:
        """The job's calls: its batches, its chunks' EXECUTEs, or EXECUTE through the gate."""
        if resolved.service_tier == BATCH:
            with _branch_import():
                from workflows.batch_tier import BatchTier
            tier = BatchTier(self._batch, BOOKKEEPING_RETRY, LOCAL_TIMEOUT)
            return await tier.execute(inp, plan)  # its batches instead of EXECUTE
        if resolved.chunk_count > 0:
            with _branch_import():
                from workflows.chunk_fan_out import execute_chunks
            return await execute_chunks(
                self._execute_through_gate, self._local, inp, plan, resolved
            )
        return await self._execute_through_gate(inp, plan)

    async def _finalize(
        self, inp: JobWorkflowInput, stage: StageInput, err: BaseException
    ) -> JobWorkflowResult:
        """The job's one terminal state after a failure or a cancel, whatever won the race."""
        if is_cancellation(err):
            fin = await self._shielded(self._local(stages.finalize_cancelled, stage))
            self._set_status(fin.lifecycle_status)
            if fin.lifecycle_status == CANCELLED and workflow.cancellation_reason() is not None:
                # Shows as Canceled in the Temporal UI. Not a re-raise: when EXECUTE saw the
                # cancel in SQL first it failed with ApplicationError(CANCELLED), which would
                # mark the execution Failed while the job is cancelled.
                raise CancelledError("The job was cancelled.") from None
            # Cancelled through SQL only (no Temporal cancel request), or a finish won.
            return JobWorkflowResult(inp.jobId, fin.lifecycle_status)
        code = error_code(err)
        fin = await self._shielded(
            self._local(
                stages.finalize_failed,
                FinalizeFailedInput(job_id=inp.jobId, code=code),
            )
        )
        self._set_status(fin.lifecycle_status)
        if fin.lifecycle_status == FAILED:
            message = public_message_for(code)
            raise ApplicationError(message, type=code, non_retryable=True) from None
        return JobWorkflowResult(inp.jobId, fin.lifecycle_status)

    async def _execute_through_gate(
        self,
        inp: JobWorkflowInput,
        plan: ExecutionPlan,
        *,
        chunk_no: int | None = None,
        spent: int | None = None,
    ) -> ExecuteResult:
        """EXECUTE, asked again after each wait its provider gate names (a limit's: until its
        time or its wake-up, workflows/limit_wait.py). A gated EXECUTE returned before it spent
        an attempt (the job still `queued`, progress 0, unless a 429 answered its call); the
        next one starts with the attempts spent so far and only the remaining ones in its retry
        policy. With `chunk_no`: that chunk's EXECUTE, `spent` its own attempts so far; its
        activity id names the chunk (`execute-chunk-3`, `execute-chunk-3-2`...), never its text."""
        spent = inp.attemptsSpent if spent is None else spent
        looks = 0
        schedules = 0
        while True:
            schedules += 1
            seen = self._wakes.count  # a wake-up during EXECUTE still ends the wait after it
            executed = await self._execute(
                inp,
                plan,
                attempt_offset=spent,
                chunk_no=chunk_no,
                activity_id=(
                    None
                    if chunk_no is None
                    else f"execute-chunk-{chunk_no}" + (f"-{schedules}" if schedules > 1 else "")
                ),
            )
            if executed.gate_wait_s <= 0:
                return executed
            spent = max(spent, executed.attempt - 1)
            if executed.gate_reason == OFFPEAK_GATE:
                with _branch_import():
                    from workflows import offpeak_hold
                wait_s = await offpeak_hold.wait_exactly(executed.gate_wait_s)  # its window
            elif executed.gate_reason in contracts.LIMIT_WAITS or (
                executed.gate_reason == OPERATOR_PAUSE  # held until its pause is lifted
            ):  # its time, or a wake-up signal
                wait_s = await wait_for_room(self._wakes, seen, executed, executed.gate_wait_s)
            else:
                looks += 1
                wait_s = max(executed.gate_wait_s, min(2.0**looks, GATE_WAIT_CAP_S))
            if wait_s > 0:  # up to 10 % more: the jobs a pause held come back spread out
                await workflow.sleep(wait_s * (1 + 0.1 * workflow.random().random()))
            # The server suggests it once the history is long (its
            # `limit.historyCount.suggestContinueAsNew`): a long outage keeps it bounded.
            if workflow.info().is_continue_as_new_suggested():
                if chunk_no is not None:
                    raise HistoryFull()  # the fan-out continues as new once its chunks end
                workflow.continue_as_new(
                    JobWorkflowInput(
                        jobId=inp.jobId,
                        jobType=inp.jobType,
                        idempotencyKey=inp.idempotencyKey,
                        createdAt=inp.createdAt,
                        attemptsSpent=spent,
                    )
                )

    @staticmethod
    async def _execute(
        inp: JobWorkflowInput,
        plan: ExecutionPlan,
        *,
        attempt_offset: int = 0,
        chunk_no: int | None = None,
        activity_id: str | None = None,
    ) -> ExecuteResult:
        return await workflow.execute_activity(
            stages.execute,
            ExecuteInput(
                job_id=inp.jobId,
                timeout_ms=plan.timeout_ms,
                abort_strategy=plan.abort_strategy,
                attempt_offset=attempt_offset,
                chunk_no=chunk_no,
            ),
            activity_id=activity_id,
            summary=None if chunk_no is None else f"chunk {chunk_no}",
            # The activity enforces timeoutMs itself (-> TIMEOUT per abortStrategy); this is
            # the backstop for a hung worker, with room for EXECUTE's own database retries.
            start_to_close_timeout=timedelta(
                milliseconds=plan.start_to_close_ms or plan.timeout_ms + 15_000
            ),
            heartbeat_timeout=timedelta(milliseconds=plan.heartbeat_timeout_ms),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(milliseconds=max(plan.backoff_ms, 1)),
                backoff_coefficient=2.0,
                maximum_attempts=max(plan.max_attempts - attempt_offset, 1),
                non_retryable_error_types=list(non_retryable_codes()),
            ),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )

    @staticmethod
    async def _local(stage: Callable[[I], Awaitable[T]], arg: I) -> T:
        return await workflow.execute_local_activity(
            stage, arg, start_to_close_timeout=LOCAL_TIMEOUT, retry_policy=BOOKKEEPING_RETRY
        )

    @staticmethod
    async def _shielded(aw: Awaitable[FinalizeResult]) -> FinalizeResult:
        """Run a finalizer to completion even if the workflow is cancelled meanwhile."""
        task = asyncio.ensure_future(aw)
        while True:
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                continue

    @staticmethod
    def _set_status(status: str) -> None:
        workflow.upsert_search_attributes([LIFECYCLE.value_set(status)])


@workflow.defn(dynamic=True)
class JobWorkflow:
    """Every job type's workflow: the workflow type is the job type's name (the relay starts
    `<jobType>`), so one class serves them all and recorded histories of each replay here.

    It holds its `JobStages` rather than inheriting them: the sandbox re-imports this module
    and re-applies `workflow.defn` at every run, which inspects every member of the class and
    of its bases, so a class with only `run` costs each run less (the commands are the same)."""

    def __init__(self) -> None:
        self._wakes = Wakes()
        self._ends = Wakes()
        self._batch = Wakes()

    @workflow.run
    async def run(self, args: Sequence[RawValue]) -> JobWorkflowResult:
        inp = workflow.payload_converter().from_payload(args[0].payload, JobWorkflowInput)
        return await JobStages(self._wakes, self._ends, self._batch).execute_job(inp)

    @workflow.signal(name=LIMIT_WAKE_SIGNAL)
    def limit_wake(self) -> None:
        """Room may have appeared for a call waiting for its provider limit."""
        self._wakes.woken()

    @workflow.signal(name=REUSE_SOURCE_ENDED_SIGNAL)
    def reuse_source_ended(self) -> None:
        """The job whose answer this one reuses has ended."""
        self._ends.woken()

    @workflow.signal(name=BATCH_RESULT_SIGNAL)
    def batch_result(self) -> None:
        """The job's batch item has its outcome recorded (workflows/batch_tier.py)."""
        self._batch.woken()
