"""The cheap stages around EXECUTE, run as local activities: PREPARE (the plan), PROJECT (the
business rows and `succeeded`, one transaction) and the two finalizers. RESOLVE and COMPLETE
stay registered for workflows started by earlier versions (they no longer run in new ones)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.failures import internal_message, loggable, private_strings
from activities.stage_support import (
    StageDeps,
    fail_attempt,
    fail_domain,
    fail_final,
    lock_owner,
    log,
    log_completed,
)
from db.errors import is_unavailable
from db.jobs import JobRow
from db.lifecycle import lock_holder
from db.outbox import CANCELLED, FAILED
from engine.contracts import (
    COMPLETE,
    FINALIZE_CANCELLED,
    FINALIZE_FAILED,
    PREPARE,
    PROJECT,
    RESOLVE,
    CompleteInput,
    CompleteResult,
    ExecutionPlan,
    FinalizeFailedInput,
    FinalizeResult,
    PrepareResult,
    ProjectInput,
    ProjectResult,
    ResolveResult,
    StageInput,
)
from engine.errors import (
    EngineError,
    ExecutionFailure,
    IllegalTransition,
    JobNotFound,
    LockConflict,
    public_message_for,
)
from engine.lifecycle import LifecycleStatus


class BookkeepingStages(StageDeps):
    # ---- PREPARE ----------------------------------------------------------------------

    @activity.defn(name=PREPARE)
    async def prepare(self, inp: StageInput) -> PrepareResult:
        """The job type's definition (the workflow type is the job type) as an execution plan,
        and the job: one that is no longer `queued` (cancelled while it waited, or ended) stops
        here. A job this workflow already holds (`running` under its own lock: a run continued
        as new while it waited on its provider, a Temporal Reset) goes on."""
        jt = self._catalog.get(activity.info().workflow_type or "")
        d = jt.definition
        cfg = self._config
        async with self._sm() as s:
            state = await self._jobs.lock_state(s, uuid.UUID(inp.job_id))
        if state is None:
            fail_final("INTERNAL_JOB_MISSING")
        status, locked_by = state
        ours = status == LifecycleStatus.RUNNING and lock_holder(locked_by) == inp.workflow_id
        if status != LifecycleStatus.QUEUED and not ours:
            return PrepareResult(run=False, lifecycle_status=status)
        # Attempts, backoff and heartbeat: the definition's own, else its queue's
        # (engine/queues.py); the settings' overrides of the lock come in through cfg.
        policy = self._execution_policy(d)
        return PrepareResult(
            run=True,
            lifecycle_status=status,
            plan=ExecutionPlan(
                queue_name=d.queue.queue_name,
                timeout_ms=d.execution.timeout_ms,
                max_attempts=policy.max_attempts,
                backoff_ms=policy.backoff_ms,
                abort_strategy=d.execution.abort_strategy,
                cancellable=d.execution.cancellable,
                heartbeat_timeout_ms=policy.heartbeat_timeout_ms,
                start_to_close_ms=d.execution.timeout_ms + cfg.execute_margin_ms,
            ),
        )

    # ---- RESOLVE ----------------------------------------------------------------------

    @activity.defn(name=RESOLVE)
    async def resolve(self, inp: StageInput) -> ResolveResult:
        """Everything EXECUTE will need, checked before the job takes a provider slot: the
        snapshot (present, unexpired), the credential (pinned, active, decryptable: decrypted
        here and dropped at once), the prompt version, the provider and model, and the limits.
        A job that cannot run fails here, with its code. Only names, ids and numbers leave."""
        job_id = uuid.UUID(inp.job_id)
        async with self._sm() as s:
            row = await self._jobs.resolve_refs(s, job_id)
            if row is None:
                fail_final("INTERNAL_JOB_MISSING")
            jt = self._catalog.get(row.job_type)
            if not row.has_snapshot:
                # Expired: the job waited longer than its input is kept (DATA_RETENTION_DAYS).
                expired = row.snapshot_stored
                fail_final("SNAPSHOT_EXPIRED" if expired else "INTERNAL_SNAPSHOT_MISSING")
            try:
                key = await self._gateway.api_key(
                    s, jt, row.user_id, row.credential_mode, row.credential_id
                )
            except ExecutionFailure as f:
                fail_final(f.code)  # revoked, missing or undecryptable: no slot, no call
            del key  # only its availability was in question
        d = jt.definition
        gate = self._gateway.gate_key(jt, row.credential_mode, row.user_id, row.credential_id)
        return ResolveResult(
            prompt_version=row.prompt_version,
            credential_mode=row.credential_mode,
            provider=self._gateway.provider_for(jt, row.credential_mode).name,
            model=self._gateway.model_for(jt, row.credential_mode),
            credential_id=str(row.credential_id) if row.credential_id else None,
            gate_key=f"{gate.provider}/{gate.key_ref}" if gate else "",
            timeout_ms=d.execution.timeout_ms,
            max_output_tokens=d.execution.max_output_tokens,
            max_attempts=self._execution_policy(d).max_attempts,
        )

    # ---- PROJECT ----------------------------------------------------------------------

    @activity.defn(name=PROJECT)
    async def project(self, inp: ProjectInput) -> ProjectResult:
        """Projector + markSucceeded + `ai.job.completed` + progress 100 in one transaction.
        Idempotent: a retry after a commit whose result was lost finds `succeeded` and its
        artifacts; unique keys make a repeated projection write nothing new."""
        job_id = uuid.UUID(inp.job_id)
        attempt = activity.info().attempt
        row: JobRow | None = None
        try:
            async with self._sm.begin() as s:
                row = await self._jobs.get(s, job_id)
                if row is None:
                    fail_final("INTERNAL_JOB_MISSING")
                if row.lifecycle_status != LifecycleStatus.RUNNING:
                    arts = await self._jobs.artifacts(s, [job_id])
                    return ProjectResult(row.lifecycle_status, len(arts[job_id]))
                if row.output is None or row.output_hash != inp.output_hash:
                    fail_final("INTERNAL_OUTPUT_MISMATCH")
                jt = self._catalog.get(row.job_type)
                out = jt.output_model.model_validate(row.output)
                result = await self._project_in(s, row, out, inp.output_hash, lock_owner())
            self._metrics.job_finished(row.job_type, "succeeded")
            log_completed(inp.job_id, result)
            return result
        except ApplicationError:
            raise
        except (IllegalTransition, LockConflict):
            # A concurrent PROJECT (or a cancel) won the row: report what the job is now.
            async with self._sm.begin() as s:
                row = await self._jobs.get(s, job_id)
                arts = await self._jobs.artifacts(s, [job_id])
            if row is None:
                fail_final("INTERNAL_JOB_MISSING")
            return ProjectResult(row.lifecycle_status, len(arts[job_id]))
        except EngineError as exc:
            fail_domain(exc)
        except Exception as exc:
            if is_unavailable(exc):
                raise  # retried by the bookkeeping policy until the database is back
            log.warning(
                "projection failed",
                extra={"job_id": inp.job_id, "attempt": attempt},
                exc_info=loggable(exc),
            )
            private = private_strings(row.input, row.output) if row is not None else []
            await self._note_internal(
                job_id, internal_message(exc, private=private, context="projection failed")
            )
            fail_attempt("INTERNAL_PROJECTION_FAILED", attempt=attempt)

    async def _note_internal(self, job_id: uuid.UUID, message: str) -> None:
        try:
            async with self._sm.begin() as s:
                await self._jobs.record_attempt(s, job_id, attempt=0, internal_error=message[:2000])
        except Exception:
            log.warning("could not record internal error", extra={"job_id": str(job_id)})

    # ---- COMPLETE (workflows started before it was folded into PROJECT) ----------------

    @activity.defn(name=COMPLETE)
    async def complete(self, inp: CompleteInput) -> CompleteResult:
        """The end of a succeeded job: its usage summary (every call of every attempt, as
        ai_usage_log holds it), logged and returned. A read: the completion event was written
        by PROJECT in the transaction that ended the job (event streams were woken by that
        commit; the relay publishes it to the owner's webhooks), so nothing here can be
        done twice."""
        async with self._sm() as s:
            usage = await self._usage.summary(s, uuid.UUID(inp.job_id))
        log.info(
            "job usage",
            extra={
                "job_id": inp.job_id,
                "calls": usage.calls,
                "tokens_in": usage.tokens_in,
                "tokens_out": usage.tokens_out,
                "cost_micros": int(usage.cost_usd * 1_000_000),
            },
        )
        return CompleteResult(
            calls=usage.calls,
            tokens_in=usage.tokens_in,
            tokens_out=usage.tokens_out,
            cost_micros=int(usage.cost_usd * 1_000_000),
        )

    # ---- finalizers -------------------------------------------------------------------

    @activity.defn(name=FINALIZE_FAILED)
    async def finalize_failed(self, inp: FinalizeFailedInput) -> FinalizeResult:
        """The job's one `failed`, after Temporal gave up on it. A cancel the user asked for
        wins over a failure that followed it (a worker lost during a cancel ends `cancelled`).
        A job that never got as far as `running` (its first EXECUTE transaction never committed)
        is taken through `running` to `failed` in one transaction, so it cannot stay queued
        behind a closed workflow."""
        job_id = uuid.UUID(inp.job_id)
        try:
            async with self._sm.begin() as s:
                row = await self._jobs.get(s, job_id)
                if row is None:
                    return FinalizeResult("failed")  # the row is gone; the execution failed
                if row.cancel_requested_at is not None and row.lifecycle_status in (
                    LifecycleStatus.QUEUED,
                    LifecycleStatus.RUNNING,
                ):
                    await self._lifecycle.mark_cancelled(s, job_id)
                    await self._event(s, CANCELLED, inp.job_id, {"jobId": inp.job_id})
                    ended, code = "cancelled", "CANCELLED"
                else:
                    if row.lifecycle_status == LifecycleStatus.QUEUED:
                        await self._lifecycle.lock(
                            s,
                            job_id,
                            owner=lock_owner(),
                            identity=self._config.identity,
                            # Taken and ended in this transaction: any TTL does.
                            ttl_s=self._config.lock_ttl_s or 60,
                        )
                    await self._lifecycle.mark_failed(
                        s, job_id, inp.code, public_message_for(inp.code), None
                    )
                    await self._event(
                        s,
                        FAILED,
                        inp.job_id,
                        {"jobId": inp.job_id, "jobType": row.job_type, "errorCode": inp.code},
                    )
                    ended, code = "failed", inp.code
            # Counted after the commit: a retried attempt finds the job ended and counts nothing.
            self._metrics.job_finished(row.job_type, ended, code)
            return FinalizeResult(ended)
        except (IllegalTransition, LockConflict):
            async with self._sm.begin() as s:
                current = await self._jobs.get(s, job_id)
            return FinalizeResult(current.lifecycle_status if current else "failed")
        except JobNotFound:
            return FinalizeResult("failed")

    @activity.defn(name=FINALIZE_CANCELLED)
    async def finalize_cancelled(self, inp: StageInput) -> FinalizeResult:
        job_id = uuid.UUID(inp.job_id)
        try:
            async with self._sm.begin() as s:
                await self._lifecycle.mark_cancelled(s, job_id)
                await self._event(s, CANCELLED, inp.job_id, {"jobId": inp.job_id})
            job_type = activity.info().workflow_type or ""  # a job workflow is named after its type
            self._metrics.job_finished(job_type, "cancelled", "CANCELLED")
            return FinalizeResult("cancelled")
        except IllegalTransition as exc:
            return FinalizeResult(str(exc.from_status))
        except JobNotFound:
            return FinalizeResult("cancelled")  # the job row is gone: nothing left to mark

    async def _event(
        self, s: AsyncSession, event_type: str, job_id: str, payload: dict[str, Any]
    ) -> None:
        """The domain event of a job's end, in the transaction that ends it."""
        await self._outbox.insert(
            s,
            event_type=event_type,
            aggregate_type="AiJob",
            aggregate_id=job_id,
            dedupe_key=f"{event_type}:{job_id}",
            payload=payload,
            notify=False,
        )
