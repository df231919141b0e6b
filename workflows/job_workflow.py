"""The job workflow: one Temporal workflow type per job type, named after it, sharing one
implementation of the stages:

    PREPARE (local)  lock queued → running, or end at once if the job already ended
    RESOLVE (local)  snapshot, credential availability, prompt version, provider
    EXECUTE          the provider call: heartbeats, cancellable, retried per the definition
    PROJECT (local)  projector + markSucceeded + ai.job.completed, one transaction

Failures after retries → FINALIZE_FAILED; cancellation → FINALIZE_CANCELLED. Both finalizers are
shielded from a (second) cancellation so that every job reaches exactly one terminal state, and
both report the state that actually won a race (e.g. a cancel racing PROJECT's commit).

Runs recorded before the `skip-complete-stage` patch ran a fifth stage, COMPLETE (local), after
PROJECT; it only logged the usage summary. Replaying such a history still takes that branch, so
the `complete` activity stays registered until the patch is retired.

Only ids, hashes and codes pass through here.

Versioning (docs/versioning.md). Workers replay open runs from their history, so a deploy must
not change the commands an already-recorded run issues (activities and their order, timers,
search-attribute upserts, child workflows, continue-as-new):

- Gate such a change with `if workflow.patched("<id>"):` new code, `else:` old code. New runs
  record the patch marker and take the new branch; old runs replay through the old one.
- Once no run started before the patch can still be open (a visibility query; jobs end within
  their timeout and retries), replace the gate by `workflow.deprecate_patch("<id>")` before the
  new code, and drop the old branch with whatever only it used (an activity, a contract) and
  the histories recorded before the patch. Once no run started before that deploy is open,
  remove the `deprecate_patch` call.
- After each such change record new histories (`python -m tests.replay.record --tag vN`) and
  keep every older tag whose runs can still be open: `tests/replay` replays all of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    FailureError,
    TimeoutError,
    TimeoutType,
)

with workflow.unsafe.imports_passed_through():
    from engine.contracts import (
        COMPLETE,
        EXECUTE,
        FINALIZE_CANCELLED,
        FINALIZE_FAILED,
        PREPARE,
        PROJECT,
        RESOLVE,
        CompleteInput,
        CompleteResult,
        ExecuteInput,
        ExecuteResult,
        ExecutionPlan,
        FinalizeFailedInput,
        FinalizeResult,
        JobWorkflowInput,
        JobWorkflowResult,
        PrepareResult,
        ProjectInput,
        ProjectResult,
        ResolveResult,
        StageInput,
    )
    from engine.errors import public_message_for
    from engine.search_attributes import JOB_ID, JOB_TYPE
    from engine.search_attributes import LIFECYCLE_STATUS as LIFECYCLE

T = TypeVar("T")

# Bookkeeping stages retry until PostgreSQL answers again (a database restart must not lose a
# job); domain errors are raised non-retryable by the activities themselves.
BOOKKEEPING_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,
)
LOCAL_TIMEOUT = timedelta(seconds=30)
# Codes that never retry; the activity also sets non_retryable on them.
NON_RETRYABLE = [
    "CONTENT_SAFETY_BLOCKED",
    "CREDENTIAL_INVALID",
    "CREDENTIAL_MISSING",
    "CREDENTIAL_INSUFFICIENT_BALANCE",
    "REQUEST_TOO_LARGE",
    "REQUEST_REJECTED",
    "CANCELLED",
]

# Patch ids: each one gates a change of the commands a run issues (see the module docstring).
SKIP_COMPLETE_STAGE = "skip-complete-stage"
# EXECUTE does the CAS queued -> running when a worker slot starts it; RESOLVE no longer runs.
EXECUTE_OWNS_RUNNING = "execute-owns-running"
# A job whose provider key is paused or whose breaker is open waits here, on a timer, instead
# of inside EXECUTE: it holds no slot, spends no attempt and no EXECUTE timeout runs while it
# waits, however long the provider stays closed.
GATE_WAIT_IN_WORKFLOW = "gate-wait-in-workflow"

# Between two looks at a closed gate the wait grows (2, 4, 8 s...) up to this cap, unless the
# gate named a longer one (a Retry-After, a breaker's cooldown): a long outage costs each job
# a few events a minute, and a reopened gate is seen within the cap.
GATE_WAIT_CAP_S = 15.0
# Past this many history events while waiting on the gate, the run continues as new (with the
# attempts it spent), so a job's history stays small whatever the outage's length.
GATE_WAIT_HISTORY_LIMIT = 2_000


def _error_code(err: BaseException) -> str:
    """The public error code behind an activity failure."""
    cause: BaseException | None = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError) and cause.type:
        return cause.type
    if isinstance(cause, TimeoutError):
        if cause.type == TimeoutType.HEARTBEAT:
            return "INTERNAL_WORKER_LOST"
        return "TIMEOUT"
    return "INTERNAL_ERROR"


def _is_cancellation(err: BaseException) -> bool:
    if isinstance(err, asyncio.CancelledError | CancelledError):
        return True
    if isinstance(err, ActivityError):
        if isinstance(err.cause, CancelledError):
            return True
        if isinstance(err.cause, ApplicationError) and err.cause.type == "CANCELLED":
            return True
    return False


class JobWorkflowBase:
    async def execute_job(self, inp: JobWorkflowInput) -> JobWorkflowResult:
        info = workflow.info()
        stage = StageInput(job_id=inp.jobId, workflow_id=info.workflow_id, run_id=info.run_id)
        self._set_status(None, inp)

        try:
            prep = await self._local(PREPARE, stage, PrepareResult)
            if not prep.run or prep.plan is None:
                # Cancelled while queued (or already ended): nothing runs.
                self._set_status(prep.lifecycle_status)
                return JobWorkflowResult(inp.jobId, prep.lifecycle_status)
            plan = prep.plan
            if workflow.patched(EXECUTE_OWNS_RUNNING):
                # EXECUTE takes the job (queued -> running) when a worker slot starts it and
                # projects it before it lets the slot go, so `running` means a slot works on
                # it; it also finds a job that ended while it waited, before any provider call.
                # PROJECT runs only when the projection inside EXECUTE failed.
                if workflow.patched(GATE_WAIT_IN_WORKFLOW):
                    executed = await self._execute_through_gate(inp, plan)
                else:
                    executed = await self._execute(inp, plan)
                if executed.lifecycle_status is not None:
                    # Projected inside EXECUTE (succeeded), or ended before it ran.
                    self._set_status(executed.lifecycle_status)
                    return JobWorkflowResult(
                        inp.jobId,
                        executed.lifecycle_status,
                        output_hash=executed.output_hash or None,
                    )
            else:
                # Histories from before the patch: PREPARE locked the job, RESOLVE read it.
                self._set_status("running")
                await self._local(RESOLVE, stage, ResolveResult)
                executed = await self._execute(inp, plan)
            projected = await self._local(
                PROJECT,
                ProjectInput(
                    job_id=inp.jobId, run_id=info.run_id, output_hash=executed.output_hash
                ),
                ProjectResult,
            )
            if projected.lifecycle_status != "succeeded":
                self._set_status(projected.lifecycle_status)
                return JobWorkflowResult(inp.jobId, projected.lifecycle_status)
            self._set_status("succeeded")
            if not workflow.patched(SKIP_COMPLETE_STAGE):
                # Histories from before the patch. COMPLETE only logged the usage summary that
                # PROJECT had committed, at the price of one more command per job.
                await self._local(
                    COMPLETE,
                    CompleteInput(
                        job_id=inp.jobId,
                        calls=projected.calls,
                        tokens_in=projected.tokens_in,
                        tokens_out=projected.tokens_out,
                        cost_micros=projected.cost_micros,
                    ),
                    CompleteResult,
                )
            return JobWorkflowResult(inp.jobId, "succeeded", output_hash=executed.output_hash)
        # A failed local activity (PREPARE, RESOLVE, PROJECT...) surfaces as its own
        # ApplicationError, not wrapped in ActivityError: catch every Temporal failure here, or
        # the workflow fails without finalizing and the job stays `running`.
        except (FailureError, asyncio.CancelledError) as err:
            if _is_cancellation(err):
                fin = await self._shielded(self._local(FINALIZE_CANCELLED, stage, FinalizeResult))
                self._set_status(fin.lifecycle_status)
                if (
                    fin.lifecycle_status == "cancelled"
                    and workflow.cancellation_reason() is not None
                ):
                    # Shows as Canceled in the Temporal UI. Not a re-raise: when EXECUTE saw the
                    # cancel in SQL first it failed with ApplicationError(CANCELLED), which would
                    # mark the execution Failed while the job is cancelled.
                    raise CancelledError("The job was cancelled.") from None
                # Cancelled through SQL only (no Temporal cancel request), or a finish won.
                return JobWorkflowResult(inp.jobId, fin.lifecycle_status)
            code = _error_code(err)
            fin = await self._shielded(
                self._local(
                    FINALIZE_FAILED,
                    FinalizeFailedInput(job_id=inp.jobId, run_id=info.run_id, code=code),
                    FinalizeResult,
                )
            )
            self._set_status(fin.lifecycle_status)
            if fin.lifecycle_status == "failed":
                raise ApplicationError(
                    public_message_for(code), type=code, non_retryable=True
                ) from None
            return JobWorkflowResult(inp.jobId, fin.lifecycle_status)

    async def _execute_through_gate(
        self, inp: JobWorkflowInput, plan: ExecutionPlan
    ) -> ExecuteResult:
        """EXECUTE, asked again after each wait its provider gate names. A gated EXECUTE
        returned before it took the job (still `queued`, progress 0) and before it spent an
        attempt; the next one starts with the attempts spent so far and only the remaining
        ones in its retry policy."""
        spent = inp.attemptsSpent
        looks = 0
        while True:
            executed = await self._execute(inp, plan, attempt_offset=spent, yield_on_gate=True)
            if executed.gate_wait_s <= 0:
                return executed
            spent = max(spent, executed.attempt - 1)
            looks += 1
            wait_s = max(executed.gate_wait_s, min(2.0**looks, GATE_WAIT_CAP_S))
            # Up to 10 % more, so the jobs a pause held do not all come back in one instant.
            await workflow.sleep(wait_s * (1 + 0.1 * workflow.random().random()))
            if workflow.info().get_current_history_length() > GATE_WAIT_HISTORY_LIMIT:
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
        yield_on_gate: bool = False,
    ) -> ExecuteResult:
        info = workflow.info()
        executed: ExecuteResult = await workflow.execute_activity(
            EXECUTE,
            ExecuteInput(
                job_id=inp.jobId,
                workflow_id=info.workflow_id,
                run_id=info.run_id,
                timeout_ms=plan.timeout_ms,
                abort_strategy=plan.abort_strategy,
                attempt_offset=attempt_offset,
                yield_on_gate=yield_on_gate,
            ),
            result_type=ExecuteResult,
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
                non_retryable_error_types=NON_RETRYABLE,
            ),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        return executed

    @staticmethod
    async def _local(name: str, arg: Any, result_type: type[T]) -> T:
        result: T = await workflow.execute_local_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=LOCAL_TIMEOUT,
            retry_policy=BOOKKEEPING_RETRY,
        )
        return result

    @staticmethod
    async def _shielded(aw: Awaitable[T]) -> T:
        """Run a finalizer to completion even if the workflow is cancelled meanwhile."""
        task = asyncio.ensure_future(aw)
        while True:
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                continue

    @staticmethod
    def _set_status(status: str | None, inp: JobWorkflowInput | None = None) -> None:
        updates = []
        if inp is not None:
            updates += [JOB_ID.value_set(inp.jobId), JOB_TYPE.value_set(inp.jobType)]
        if status is not None:
            updates.append(LIFECYCLE.value_set(status))
        if updates:
            workflow.upsert_search_attributes(updates)


_CLASSES: dict[str, type] = {}


def workflow_class_for(job_type: str) -> type:
    """The workflow class of one job type, created once and published as a module global so the
    sandbox (which imports this module passed through) finds it by name."""
    if job_type in _CLASSES:
        return _CLASSES[job_type]
    name = f"JobWorkflow_{job_type}"

    async def run(self: JobWorkflowBase, inp: JobWorkflowInput) -> JobWorkflowResult:
        return await self.execute_job(inp)

    run.__qualname__ = f"{name}.run"
    run.__annotations__ = {"inp": JobWorkflowInput, "return": JobWorkflowResult}
    cls = type(name, (JobWorkflowBase,), {"run": workflow.run(run), "__module__": __name__})
    cls.__qualname__ = name
    cls = workflow.defn(name=job_type)(cls)
    globals()[name] = cls
    _CLASSES[job_type] = cls
    return cls
