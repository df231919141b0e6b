"""Bounded bookkeeping stages: an unexpected error ends the job, an outage is waited out.

The bookkeeping stages (PREPARE, RESOLVE, PROJECT, MERGE, REUSE, COMPLETE, the two finalizers) run
under a retry policy without a maximum (`BOOKKEEPING_RETRY` in workflows/job_workflow.py), so
that a database restart never loses a job. That policy is part of the commands recorded
histories replay, so it stays; the bound is kept here, in the worker, instead:

- an infrastructure outage passes through unchanged and is retried as before: the database
  unreachable (`db.errors.is_unavailable`), a network error or timeout, a Temporal or RPC
  error, a cancel;
- an `ApplicationError` the stage raised itself passes through unchanged (the stage chose its
  code and whether it may be retried);
- any other exception is a bug or a deterministic fault (a violated constraint, a trigger, a
  statement PostgreSQL refuses): retried as before until it has been seen on
  `STAGE_INTERNAL_ATTEMPTS` attempts (default 3: about 3 s of backoff), then raised as a
  non-retryable `ApplicationError(type="INTERNAL_ERROR")` with the code's public message. The
  workflow's failure path then ends the job `failed` with `INTERNAL_ERROR` (finalize_failed);
  a finalizer that fails that way closes the workflow failed, and the reconciler ends the job
  (docs/contracts.md "Errors").

Before it gives up, the stage's internal message (type, SQLSTATE or withheld message, the
engine's own frames: `activities.failures.internal_message`) is recorded for SUPER_ADMIN in
`ai_job.internal_error_message`, best effort: the fault may be the very write that would record
it. Temporal only ever sees the code and its public message. EXECUTE has its own bounded policy
and is not touched.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, TemporalError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.failures import INTERNAL_ERROR, internal_message, loggable, private_strings
from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db.errors import is_unavailable
from db.session import SessionMaker
from engine.contracts import (
    BATCH_COLLECT,
    BATCH_ENROLL,
    BATCH_LEAVE,
    COMPLETE,
    FINALIZE_CANCELLED,
    FINALIZE_FAILED,
    MERGE,
    PREPARE,
    PROJECT,
    RESOLVE,
    REUSE,
)
from engine.errors import public_message_for

log = logging.getLogger(__name__)

# The stages the bound applies to: every job stage but EXECUTE (bounded by its own policy).
BOUNDED_STAGES = frozenset(
    {PREPARE, RESOLVE, PROJECT, MERGE, REUSE, COMPLETE, FINALIZE_FAILED, FINALIZE_CANCELLED}
    | {BATCH_ENROLL, BATCH_COLLECT, BATCH_LEAVE}
)
DEFAULT_ATTEMPTS = 3
# What `internal_error_message` may hold (the column's bound elsewhere in the stages).
RECORD_MAX_CHARS = 2000


# Beyond the database's own outage errors: Temporal's errors (an RPC, a cancel, a failure the
# stage named), and a network that refuses or times out before any driver wraps it.
PASSED_THROUGH: tuple[type[BaseException], ...] = (
    TemporalError,
    asyncio.CancelledError,
    ConnectionError,
    TimeoutError,
)


def is_passed_through(exc: BaseException) -> bool:
    """An outage, a cancel, or a failure the stage (or Temporal) already named: retried or
    reported exactly as without this interceptor."""
    return isinstance(exc, PASSED_THROUGH) or is_unavailable(exc)


def internal_failure() -> ApplicationError:
    """What Temporal records when a stage gives up: the code and its public message only."""
    return ApplicationError(
        public_message_for(INTERNAL_ERROR), type=INTERNAL_ERROR, non_retryable=True
    )


class _Inbound(ActivityInboundInterceptor):
    def __init__(
        self, next: ActivityInboundInterceptor, sessionmaker: SessionMaker | None, attempts: int
    ) -> None:
        super().__init__(next)
        self._sessionmaker = sessionmaker
        self._attempts = attempts

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        if info.activity_type not in BOUNDED_STAGES:
            return await self.next.execute_activity(input)
        try:
            return await self.next.execute_activity(input)
        except Exception as exc:
            if is_passed_through(exc) or info.attempt < self._attempts:
                raise  # retried by the stage's policy (the public-failure rule names it)
            log.error(
                "a stage failed on every attempt with an unexpected error: the job ends",
                extra={
                    "activity": info.activity_type,
                    "workflow_id": info.workflow_id,
                    "attempt": info.attempt,
                    "error_type": type(exc).__name__,
                    "alert": "AIJOBS_STAGE_INTERNAL_ERROR",
                },
                exc_info=loggable(exc),
            )
            job_id = getattr(input.args[0], "job_id", None) if input.args else None
            if isinstance(job_id, str):
                await self._record(job_id, info.activity_type, exc)
            raise internal_failure() from None

    async def _record(self, job_id: str, stage: str, exc: BaseException) -> None:
        """The SUPER_ADMIN's view of `exc` on the job, never its data: when the job's input
        and output cannot be read to check the message against, the message is withheld."""
        if self._sessionmaker is None:
            return
        try:
            key = uuid.UUID(job_id)
            private: list[str] = [str(exc)]  # unread data: the whole message counts as private
            try:
                async with self._sessionmaker.begin() as s:
                    row = await jobs_db.get(s, key)
                if row is not None:
                    private = private_strings(row.input, row.output)
            except Exception:
                pass  # the fault may be this read: the message stays withheld
            message = internal_message(exc, private=private, context=f"{stage} failed")
            async with self._sessionmaker.begin() as s:
                await lifecycle_db.record_attempt(
                    s, key, attempt=0, internal_error=message[:RECORD_MAX_CHARS]
                )
        except Exception as err:
            log.warning(
                "could not record a stage's internal error",
                extra={"job_id": job_id, "error_type": type(err).__name__},
            )


class BoundedStagesInterceptor(Interceptor):
    """Registered on the job workers inside the public-failure rule (listed after
    `PublicFailureInterceptor`), so it sees the stage's own exception, not its public form.
    `sessionmaker`: where the internal message is recorded (None: it is only logged)."""

    def __init__(
        self, sessionmaker: SessionMaker | None = None, attempts: int = DEFAULT_ATTEMPTS
    ) -> None:
        if attempts < 1:
            raise ValueError("a stage has at least one attempt")
        self._sessionmaker = sessionmaker
        self._attempts = attempts

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self._sessionmaker, self._attempts)
