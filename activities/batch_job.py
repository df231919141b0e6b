"""A batch-tier job's stages in place of EXECUTE (local activities, like the bookkeeping stages:
none of them calls a provider, so none holds a worker slot):

    batch_enroll    the job taken queued → running, its cost covered at the batch price, its
                    request body built, its attempt's item in its group's open batch; then the
                    batch workflow started if it is not running (activities/batch.py)
    batch_collect   the item's outcome: the validated answer stored as the job's output, or the
                    attempt's failure with its code; `pending` while the batch runs
    batch_leave     a cancelled job's live item leaves its batch; a batch left with no live
                    item is poked: it ends without a call, or is cancelled at the provider

Thin adapters over `jobs/batch_job.py`: each opens the transaction, maps the use case's outcome
to its result or to a failure (`activities/failures.py`), and returns ids, hashes and codes only.
The Temporal client they start and signal workflows with is the worker's own
(`activity.client()`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from activities.batch import start_batch_workflow
from activities.deps import StageDeps, lock_owner, log
from activities.failures import fail_final, fail_over_budget
from db.batches import ENDED, Enrolled
from engine.contracts import (
    BATCH_COLLECT,
    BATCH_ENROLL,
    BATCH_LEAVE,
    BatchAttemptInput,
    BatchCollectResult,
    BatchEnrollResult,
    BatchLeaveResult,
)
from engine.errors import ExecutionFailure, public_message_for
from engine.tiers import BATCH_POKE_SIGNAL
from jobs import batch_job
from jobs.batch_job import Attempt, Ended, Failed, Pending, Refused, Stop, Stored


class BatchJob:
    """The batch-tier stages of one worker, built from the same `StageDeps` as the others."""

    def __init__(self, deps: StageDeps) -> None:
        self._d = deps

    def _attempt(self, inp: BatchAttemptInput) -> Attempt:
        info = activity.info()
        return Attempt(
            job_id=uuid.UUID(inp.job_id),
            owner=lock_owner(),
            identity=self._d.config.identity,
            run_id=info.workflow_run_id,
            number=inp.attempt,
            timeout_ms=inp.timeout_ms,
            task_queue=info.task_queue,
        )

    @activity.defn(name=BATCH_ENROLL)
    async def batch_enroll(self, inp: BatchAttemptInput) -> BatchEnrollResult:
        """The attempt's item, committed with the job's take, then its batch workflow started
        (a running one is left alone). A retry finds its item again and starts nothing twice."""
        d, a = self._d, self._attempt(inp)
        async with d.sessionmaker.begin() as s:
            got = await batch_job.enroll(s, d.gateway, d.catalog, d.config, a, d.config.batch_caps)
            if isinstance(got, Refused):  # rolls the take back
                fail_over_budget(inp.job_id, got.limit, inp.attempt)
            if isinstance(got, Stop):
                fail_final(got.code)  # rolls back
        if isinstance(got, Ended):
            return BatchEnrollResult(enrolled=False, lifecycle_status=got.status)
        if isinstance(got, Stored):
            return BatchEnrollResult(enrolled=False, output_hash=got.output_hash)
        assert isinstance(got, Enrolled)
        await start_batch_workflow(activity.client(), got, a.task_queue)
        log.info(
            "job enrolled in a batch",
            extra={"job_id": inp.job_id, "attempt": inp.attempt, "batch_id": str(got.batch_id)},
        )
        return BatchEnrollResult(enrolled=True, batch_id=str(got.batch_id))

    @activity.defn(name=BATCH_COLLECT)
    async def batch_collect(self, inp: BatchAttemptInput) -> BatchCollectResult:
        """The attempt's item once its batch signalled: `succeeded` (the output stored),
        `failed` (the attempt spent, its code) or `pending` (the lock extended)."""
        d, a = self._d, self._attempt(inp)
        try:
            async with d.sessionmaker.begin() as s:
                got = await batch_job.collect(s, d.gateway, d.catalog, a, d.config.batch_caps)
                if isinstance(got, Stop):
                    fail_final(got.code)  # rolls back: nothing stored
        except ExecutionFailure as unavailable:  # moderation away: looked at again, no call
            raise ApplicationError(
                public_message_for(unavailable.code), type=unavailable.code
            ) from None
        if isinstance(got, Enrolled):  # its line refused for its form: again, one form down
            await start_batch_workflow(activity.client(), got, a.task_queue)
            return BatchCollectResult(status="pending")
        if isinstance(got, Pending):
            return BatchCollectResult(status="pending")
        if isinstance(got, Failed):
            log.info(
                "batch attempt failed",
                extra={"job_id": inp.job_id, "attempt": inp.attempt, "error_code": got.code},
            )
            return BatchCollectResult(status="failed", error_code=got.code)
        return BatchCollectResult(status="succeeded", output_hash=got.output_hash)

    @activity.defn(name=BATCH_LEAVE)
    async def batch_leave(self, inp: BatchAttemptInput) -> BatchLeaveResult:
        """The job's live item cancelled; its batch poked when no live item is left: one not
        yet uploaded then closes at once and ends without a call, a submitted one is cancelled
        at the provider by that poll (a lost poke costs only time: its own timer comes)."""
        d = self._d
        async with d.sessionmaker.begin() as s:
            left = await batch_job.leave(s, uuid.UUID(inp.job_id))
        if left is None:
            return BatchLeaveResult(left=False)
        if not left.all_cancelled or left.batch_status in ENDED:
            return BatchLeaveResult(left=True)
        try:
            handle = activity.client().get_workflow_handle(left.workflow_id)
            await handle.signal(BATCH_POKE_SIGNAL)
        except RPCError:  # the batch workflow ended meanwhile, or Temporal is away
            log.warning("batch poke not delivered", extra={"batch_id": str(left.batch_id)})
            return BatchLeaveResult(left=True)
        return BatchLeaveResult(left=True, poked=True)

    def all(self) -> list[Callable[..., Any]]:
        return [self.batch_enroll, self.batch_collect, self.batch_leave]
