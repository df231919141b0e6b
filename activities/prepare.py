"""PREPARE (a local activity): the job type's definition as an execution plan, and the job's
state. A job no longer `queued` (cancelled while it waited, or ended) stops here, before any
other stage runs."""

from __future__ import annotations

import uuid

from temporalio import activity

from activities.deps import StageDeps
from activities.failures import fail_final
from db.lifecycle import lock_holder
from db.stage_reads import prepare_read
from engine.contracts import PREPARE, ExecutionPlan, PrepareResult, StageInput
from engine.lifecycle import LifecycleStatus


class Prepare:
    def __init__(self, deps: StageDeps) -> None:
        self._d = deps

    @activity.defn(name=PREPARE)
    async def prepare(self, inp: StageInput) -> PrepareResult:
        """The job type's definition (the workflow type is the job type) as an execution plan,
        and the job: one that is no longer `queued` (cancelled while it waited, or ended) stops
        here. A job this workflow already holds (`running` under its own lock: a run continued
        as new while it waited on its provider, a Temporal Reset) goes on."""
        info = activity.info()
        d = self._d.catalog.get(info.workflow_type or "").definition
        job_id = uuid.UUID(inp.job_id)
        # One round trip (db/stage_reads.py), RESOLVE's rows read with it and left for it.
        state, resolve_rows = await prepare_read(self._d.sessionmaker, job_id)
        if state is None:
            fail_final("INTERNAL_JOB_MISSING")
        status = state.status
        ours = status == LifecycleStatus.RUNNING and lock_holder(state.locked_by) == inp.workflow_id
        if status != LifecycleStatus.QUEUED and not ours:
            return PrepareResult(run=False, lifecycle_status=status)
        self._d.handoff.put(info.workflow_run_id or "", job_id, resolve_rows)
        # Attempts, backoff and heartbeat: the definition's own, else its queue's
        # (engine/queues.py); the settings' overrides of the lock come in through the config.
        policy = self._d.execution_policy(d)
        # Flow control's times, for the workflow's timer: a start-by time only while the job
        # waits to be admitted (queued), a deadline whatever it does.
        expires = state.expires_at if status == LifecycleStatus.QUEUED else None
        return PrepareResult(
            run=True,
            lifecycle_status=status,
            expires_at=expires.isoformat() if expires is not None else "",
            deadline=state.deadline_at.isoformat() if state.deadline_at is not None else "",
            plan=ExecutionPlan(
                timeout_ms=d.execution.timeout_ms,
                max_attempts=policy.max_attempts,
                backoff_ms=policy.backoff_ms,
                abort_strategy=d.execution.abort_strategy,
                heartbeat_timeout_ms=policy.heartbeat_timeout_ms,
                start_to_close_ms=d.execution.timeout_ms + self._d.config.execute_margin_ms,
            ),
        )
