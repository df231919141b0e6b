"""Flow control's stage and EXECUTE's side of it (jobs/flow.py, jobs/pauses.py).

- `flow_expire` (a local activity): the job workflow's durable timer of a start-by time or a
  deadline came (workflows/flow_guard.py): the job ends, or a running one's cancel is
  requested, in one transaction.
- `expired_at_start`: EXECUTE's first transaction found the job's time passed (and rolled
  back): it ends the job the same way, instead of a call.
- `wait_place`: a call admission held back takes its place for its wake-up: an operator
  pause's hold (jobs/pauses.py `hold`) or a provider limit's fair queue (jobs/limit_wake.py).
"""

from __future__ import annotations

import uuid

from temporalio import activity

from activities.deps import StageDeps
from activities.failures import fail_final
from engine.contracts import FLOW_EXPIRE, FlowExpireInput, FlowExpireResult
from engine.flow import OPERATOR_PAUSE
from jobs import flow, limit_wake, pauses
from jobs.waits import Wait


class FlowStage:
    def __init__(self, deps: StageDeps) -> None:
        self._d = deps

    @activity.defn(name=FLOW_EXPIRE)
    async def flow_expire(self, inp: FlowExpireInput) -> FlowExpireResult:
        """The job's start-by time or deadline came while its workflow waited (jobs/flow.py
        `expire`); counted once, by the call that acted."""
        got = await flow.expire(self._d.sessionmaker, uuid.UUID(inp.job_id), inp.code)
        if got.acted:
            self._d.metrics.flow.ended(got.job_type, inp.code)
        return FlowExpireResult(ended=got.ended, lifecycle_status=got.status)


async def expired_at_start(deps: StageDeps, job_id: uuid.UUID, code: str) -> str:
    """The job's time passed before its call: it ends with `code` (queued: cancelled now, its
    state returned); a running job at its deadline has its cancel requested and the attempt
    fails `CANCELLED` (its workflow's finalizer ends it with the code the request recorded)."""
    got = await flow.expire(deps.sessionmaker, job_id, code)
    if got.acted:
        deps.metrics.flow.ended(got.job_type, code)
    if got.status == flow.RUNNING:
        fail_final("CANCELLED")
    return got.status


async def wait_place(deps: StageDeps, wait: Wait, job_id: uuid.UUID, workflow_id: str) -> bool:
    """The held-back call's place for its wake-up (counted once when it enters); True: room
    (or the pause) went away before the place was written, look again now."""
    metrics = deps.metrics
    if wait.reason == OPERATOR_PAUSE:

        def counted(w: Wait) -> None:
            metrics.limiter_waited(w.provider, w.model, w.reason, w.wait_s)
            metrics.flow.held(w.job_type)

        held = await pauses.hold(deps.sessionmaker, wait, job_id, workflow_id, counted)
        return held.look_again
    queued = await limit_wake.enqueue(
        deps.sessionmaker, wait, job_id, workflow_id, metrics.limiter_waited
    )
    return queued.look_again
