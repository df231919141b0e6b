"""The lifecycle repository: the only code that writes `ai_job.lifecycle_status` (DESIGN §2.2).

Every transition is one compare-and-set UPDATE that also shadow-writes the legacy `status` column
and sets `finished_at` on terminal states. When the CAS matches no row, a follow-up read names the
state that was found, and a typed error is raised (`IllegalTransition`, `LockConflict`,
`JobNotFound`). The `ai_job_lifecycle_guard` trigger enforces the same table underneath.

Methods take an optional session: given one, they join the caller's transaction (the projector's,
the create use case's); without one they run in a transaction of their own (ADR §1.4 `tx?`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from db.session import SessionMaker
from engine.errors import IllegalTransition, JobNotFound, LockConflict
from engine.lifecycle import LEGACY_STATUS, LifecycleStatus, is_legal

S = LifecycleStatus
# Every statement that creates a job or changes its state or progress also runs
# `pg_notify(JOB_CHANGED_CHANNEL, <job id>)` in its RETURNING list: the notification is
# delivered when (and only if) the transaction commits, and carries the job id only.
JOB_CHANGED_CHANNEL = "ai_job_changed"


@dataclass(frozen=True)
class NewJob:
    id: uuid.UUID
    user_id: str
    job_type: str
    target_type: str
    target_id: str
    idempotency_key: str | None
    request_fingerprint: str
    queue_name: str
    priority: int
    input: dict[str, Any]
    credential_mode: str
    credential_id: uuid.UUID | None
    prompt_version: str
    input_schema_version: str
    output_schema_version: str
    max_retry_count: int
    workflow_id: str
    retried_from_job_id: uuid.UUID | None = None


@dataclass(frozen=True)
class LockedJob:
    id: uuid.UUID
    job_type: str
    queue_name: str
    locked_by: str
    lock_until: datetime
    reacquired: bool  # True when a retried PREPARE found its own lock


@dataclass(frozen=True)
class ExtendResult:
    extended: bool
    cancel_requested: bool


@dataclass(frozen=True)
class JobLockRow:
    id: uuid.UUID
    job_type: str
    queue_name: str
    workflow_id: str
    locked_by: str | None
    lock_until: datetime | None
    cancel_requested_at: datetime | None


def owner_token(owner: str, identity: str, run_id: str | None = None) -> str:
    """`locked_by` = workflow id / run id / worker identity. Ownership is decided by the workflow
    id alone (the part before the first "/"): a stage retried on another worker, or a new run
    after an operator's Temporal Reset, still recognises the job's lock; the run id and the
    worker identity are kept for diagnostics. Workflow ids never contain "/"."""
    return f"{owner}/{run_id or '-'}/{identity}"[:255]


_INSERT = text(
    """
    INSERT INTO ai_job (
        id, user_id, job_type, target_type, target_id, idempotency_key, request_fingerprint,
        lifecycle_status, status, queue_name, priority, progress, input, credential_mode,
        credential_id, prompt_version, input_schema_version, output_schema_version,
        attempt_count, max_retry_count, workflow_id, retried_from_job_id, created_at, updated_at)
    VALUES (
        :id, :user_id, :job_type, :target_type, :target_id, :idempotency_key,
        :request_fingerprint, 'queued', 'pending', :queue_name, :priority, 0, :input,
        :credential_mode, :credential_id, :prompt_version, :input_schema_version,
        :output_schema_version, 0, :max_retry_count, :workflow_id, :retried_from_job_id,
        now(), now())
    RETURNING pg_notify('ai_job_changed', id::text) IS NULL AS notified
    """
).bindparams(bindparam("input", type_=JSONB))


class LifecycleRepository:
    def __init__(self, sessionmaker: SessionMaker) -> None:
        self._sm = sessionmaker

    @asynccontextmanager
    async def _tx(self, session: AsyncSession | None) -> AsyncIterator[AsyncSession]:
        if session is not None:
            yield session
            return
        async with self._sm.begin() as own:
            yield own

    # ---- (new) -> queued --------------------------------------------------------------

    async def create(self, session: AsyncSession, job: NewJob) -> None:
        """Insert a queued job; always inside the caller's create transaction (ADR §2.4)."""
        await session.execute(_INSERT, job.__dict__)

    # ---- queued -> running --------------------------------------------------------------

    async def lock(
        self,
        job_id: uuid.UUID,
        *,
        owner: str,
        identity: str,
        ttl_s: int,
        run_id: str | None = None,
        session: AsyncSession | None = None,
    ) -> LockedJob:
        """CAS queued → running. A retry by the same workflow (any run of it) finds its own lock
        and succeeds (the UPDATE matches `running` rows it owns); anyone else gets
        `LockConflict`."""
        token = owner_token(owner, identity, run_id)
        async with self._tx(session) as s:
            row = (
                await s.execute(
                    text(
                        """
                        UPDATE ai_job SET
                            lifecycle_status = 'running', status = 'processing',
                            locked_by = :token, locked_at = now(),
                            lock_until = now() + make_interval(secs => :ttl),
                            started_at = coalesce(started_at, now()),
                            progress = greatest(progress, 10), updated_at = now()
                        WHERE id = :id AND (
                            lifecycle_status = 'queued'
                            OR (lifecycle_status = 'running'
                                AND split_part(locked_by, '/', 1) = :owner))
                        RETURNING id, job_type, queue_name, locked_by, lock_until,
                                  (started_at < now()) AS reacquired,
                                  pg_notify('ai_job_changed', id::text) IS NULL AS notified
                        """
                    ),
                    {"id": job_id, "token": token, "ttl": ttl_s, "owner": owner},
                )
            ).first()
            if row is None:
                current = await self._current(s, job_id)
                if current is None:
                    raise JobNotFound()
                status, locked_by = current
                if status == S.RUNNING:
                    raise LockConflict(str(job_id), locked_by)
                raise IllegalTransition(str(job_id), status, S.RUNNING)
            return LockedJob(
                id=row.id,
                job_type=row.job_type,
                queue_name=row.queue_name,
                locked_by=row.locked_by,
                lock_until=row.lock_until,
                reacquired=bool(row.reacquired),
            )

    async def extend_lock(
        self, job_id: uuid.UUID, *, owner: str, ttl_s: int, session: AsyncSession | None = None
    ) -> ExtendResult:
        """The heartbeat: only the owner, only while running. Also reports a pending cancel."""
        async with self._tx(session) as s:
            row = (
                await s.execute(
                    text(
                        """
                        UPDATE ai_job SET lock_until = now() + make_interval(secs => :ttl),
                                          updated_at = now()
                        WHERE id = :id AND lifecycle_status = 'running'
                          AND split_part(locked_by, '/', 1) = :owner
                        RETURNING cancel_requested_at
                        """
                    ),
                    {"id": job_id, "ttl": ttl_s, "owner": owner},
                )
            ).first()
            if row is None:
                return ExtendResult(extended=False, cancel_requested=False)
            return ExtendResult(extended=True, cancel_requested=row.cancel_requested_at is not None)

    # ---- running -> terminal ------------------------------------------------------------

    async def mark_succeeded(
        self,
        job_id: uuid.UUID,
        *,
        owner: str | None = None,
        session: AsyncSession | None = None,
    ) -> None:
        async with self._tx(session) as s:
            await self._transition(
                s, job_id, (S.RUNNING,), S.SUCCEEDED, owner=owner, extra="progress = 100"
            )

    async def mark_failed(
        self,
        job_id: uuid.UUID,
        code: str,
        public_message: str,
        internal_message: str | None = None,
        *,
        owner: str | None = None,
        session: AsyncSession | None = None,
    ) -> None:
        """running → failed. `internal_message=None` keeps what an attempt already recorded."""
        async with self._tx(session) as s:
            await self._transition(
                s,
                job_id,
                (S.RUNNING,),
                S.FAILED,
                owner=owner,
                extra=(
                    "error_code = :code, public_error_message = :public, "
                    "internal_error_message = coalesce(:internal, internal_error_message)"
                ),
                params={"code": code, "public": public_message, "internal": internal_message},
            )

    async def mark_cancelled(
        self, job_id: uuid.UUID, *, session: AsyncSession | None = None
    ) -> LifecycleStatus:
        """queued|running → cancelled; returns the state it came from."""
        async with self._tx(session) as s:
            return await self._transition(
                s,
                job_id,
                (S.QUEUED, S.RUNNING),
                S.CANCELLED,
                extra=(
                    "error_code = 'CANCELLED', public_error_message = 'The job was cancelled.', "
                    "cancel_requested_at = coalesce(cancel_requested_at, now())"
                ),
            )

    async def mark_cancelled_if_queued(
        self, job_id: uuid.UUID, *, session: AsyncSession | None = None
    ) -> None:
        """The cancel API's CAS: queued → cancelled only (running jobs end in their workflow)."""
        async with self._tx(session) as s:
            await self._transition(
                s,
                job_id,
                (S.QUEUED,),
                S.CANCELLED,
                extra=(
                    "error_code = 'CANCELLED', public_error_message = 'The job was cancelled.', "
                    "cancel_requested_at = coalesce(cancel_requested_at, now())"
                ),
            )

    async def request_cancel(
        self, job_id: uuid.UUID, *, session: AsyncSession | None = None
    ) -> LifecycleStatus:
        """Set cancel_requested_at on a running job (no state change); returns the job's state.
        The caller cancels the workflow after this commits."""
        async with self._tx(session) as s:
            row = (
                await s.execute(
                    text(
                        """
                        UPDATE ai_job SET
                            cancel_requested_at = coalesce(cancel_requested_at, now()),
                            updated_at = now()
                        WHERE id = :id AND lifecycle_status = 'running'
                        RETURNING lifecycle_status
                        """
                    ),
                    {"id": job_id},
                )
            ).first()
            if row is not None:
                return S(row.lifecycle_status)
            current = await self._current(s, job_id)
            if current is None:
                raise JobNotFound()
            return S(current[0])

    async def _transition(
        self,
        s: AsyncSession,
        job_id: uuid.UUID,
        from_states: Sequence[LifecycleStatus],
        to: LifecycleStatus,
        *,
        owner: str | None = None,
        extra: str = "",
        params: dict[str, Any] | None = None,
    ) -> LifecycleStatus:
        for f in from_states:
            assert is_legal(f, to), f"{f} -> {to} is not in the transition table"
        owner_clause = " AND split_part(locked_by, '/', 1) = :owner" if owner else ""
        sets = f", {extra}" if extra else ""
        stmt = text(
            f"""
            WITH prev AS (SELECT lifecycle_status FROM ai_job WHERE id = :id FOR UPDATE)
            UPDATE ai_job SET lifecycle_status = :to, status = :legacy,
                finished_at = now(), lock_until = NULL, updated_at = now(){sets}
            FROM prev
            WHERE ai_job.id = :id AND ai_job.lifecycle_status = ANY(:from_states){owner_clause}
            RETURNING prev.lifecycle_status AS from_status,
                pg_notify('ai_job_changed', ai_job.id::text) IS NULL AS notified
            """
        )
        row = (
            await s.execute(
                stmt,
                {
                    "id": job_id,
                    "to": str(to),
                    "legacy": LEGACY_STATUS[to],
                    "from_states": [str(f) for f in from_states],
                    "owner": owner,
                    **(params or {}),
                },
            )
        ).first()
        if row is None:
            current = await self._current(s, job_id)
            if current is None:
                raise JobNotFound()
            status, locked_by = current
            if owner and status in from_states:
                # The state matched but the lock belongs to another workflow: not ours to finish.
                raise LockConflict(str(job_id), locked_by)
            raise IllegalTransition(str(job_id), status, to)
        return S(row.from_status)

    @staticmethod
    async def _current(s: AsyncSession, job_id: uuid.UUID) -> tuple[str, str | None] | None:
        row = (
            await s.execute(
                text("SELECT lifecycle_status, locked_by FROM ai_job WHERE id = :id"),
                {"id": job_id},
            )
        ).first()
        return (row.lifecycle_status, row.locked_by) if row else None

    # ---- reads --------------------------------------------------------------------------

    async def find_by_lifecycle_status(
        self,
        statuses: Sequence[LifecycleStatus],
        *,
        queue_name: str | None = None,
        limit: int = 100,
        session: AsyncSession | None = None,
    ) -> list[uuid.UUID]:
        async with self._tx(session) as s:
            rows = await s.execute(
                text(
                    """
                    SELECT id FROM ai_job
                    WHERE lifecycle_status = ANY(:st)
                      AND (CAST(:q AS text) IS NULL OR queue_name = :q)
                    ORDER BY created_at, id LIMIT :lim
                    """
                ),
                {"st": [str(x) for x in statuses], "q": queue_name, "lim": limit},
            )
            return [r.id for r in rows]

    async def find_expired_locks(
        self,
        threshold_s: float,
        *,
        after: tuple[datetime | None, uuid.UUID] | None = None,
        limit: int = 100,
        session: AsyncSession | None = None,
    ) -> list[JobLockRow]:
        """Running jobs whose lock_until lies more than `threshold_s` in the past, in
        (lock_until, id) order, after the keyset `after`: callers page through all of them."""
        async with self._tx(session) as s:
            rows = await s.execute(
                text(
                    """
                    SELECT id, job_type, queue_name, workflow_id, locked_by, lock_until,
                           cancel_requested_at
                    FROM ai_job
                    WHERE lifecycle_status = 'running'
                      AND lock_until < now() - make_interval(secs => :th)
                      AND (CAST(:al AS timestamptz) IS NULL OR (lock_until, id) > (:al, :ai))
                    ORDER BY lock_until, id LIMIT :lim
                    """
                ),
                {
                    "th": threshold_s,
                    "lim": limit,
                    "al": after[0] if after else None,
                    "ai": after[1] if after else None,
                },
            )
            return [JobLockRow(**r._mapping) for r in rows]
