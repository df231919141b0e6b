"""The writes of an `ai_job` row: its insert, its lock (queued → running), the cancel request,
and a running job's bookkeeping (the attempt, the output). With db/endings.py (the terminal
transitions), the only code that writes `ai_job.lifecycle_status`.

A transition is one compare-and-set UPDATE that also shadow-writes the legacy `status` column.
When the CAS matches no row, a follow-up read names the state that was found, and a typed error
is raised (`IllegalTransition`, `LockConflict`, `JobNotFound`). The `ai_job_lifecycle_guard`
trigger enforces the same table underneath.

Every function runs in the session it is given and never begins or commits a transaction: the
use case or activity that calls it owns the transaction, like every repository in db/.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from db.jobs import JOB_COLUMNS, JobRow
from engine.errors import IllegalTransition, JobNotFound, LockConflict
from engine.lifecycle import LEGACY_STATUS, TERMINAL, LifecycleStatus

S = LifecycleStatus
# Every statement that creates a job or changes its state or progress also runs
# `pg_notify(JOB_CHANGED_CHANNEL, <job id>)` in its RETURNING list: the notification is
# delivered when (and only if) the transaction commits, and carries the job id only.
JOB_CHANGED_CHANNEL = "ai_job_changed"


def _status_in(statuses: frozenset[LifecycleStatus] | set[LifecycleStatus]) -> str:
    return "lifecycle_status IN ({})".format(", ".join(f"'{x}'" for x in sorted(statuses)))


# SQL conditions "the job has ended" (engine.lifecycle.TERMINAL) and "the job has not ended yet".
# Literal SQL rather than bound parameters: the planner then matches the partial indexes whose
# predicates name the same states.
TERMINAL_SQL = _status_in(TERMINAL)
ACTIVE_SQL = _status_in(set(LifecycleStatus) - TERMINAL)


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
    # Tokens and money (db/budgets.py): fixed at create, read by the limiter and EXECUTE.
    estimated_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_cost_usd: Decimal | None = None
    reserved_cost_usd: Decimal = Decimal(0)
    chunk_count: int | None = None  # set with the job's chunk plan (db/chunks.py)
    metadata: dict[str, str] = field(default_factory=dict)  # the client's own references
    run_at: datetime | None = None  # a delayed job's start (None: at once)
    service_tier: str = "standard"  # engine/tiers.py
    offpeak_deadline_at: datetime | None = None  # an off-peak job's deadline
    offpeak_on_deadline: str | None = None  # and what it does there ("standard", "fail")
    reuse_allowed: bool = False  # the create said `reuse: "allow"`
    reused_from_job_id: uuid.UUID | None = None  # the job whose answer it reuses
    reuse_key: str | None = None  # what it asks, for reuse (jobs/reuse.py); None: no reuse
    # Whose money it is beyond its user's (engine/scopes.py): fixed here, never changed.
    org_id: str | None = None
    team_ids: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    # Its rollout's id and arm, and the arm's model (jobs/rollouts.py); None: no rollout.
    rollout_id: uuid.UUID | None = None
    rollout_arm: str | None = None
    arm_model: str | None = None
    # A by-design wait before dispatch (a delayed job's runAt): the relay leaves the job alone
    # until then, and it takes no room in its user's dispatch window (db/relay.py).
    due_at: datetime | None = None
    # Flow control (engine/flow.py): `concurrency` as given and its key, a debounce chain's
    # latest start, the start-by time (TTL) and the deadline.
    concurrency: dict[str, Any] | None = None
    concurrency_key: str | None = None
    debounce_until: datetime | None = None
    expires_at: datetime | None = None
    deadline_at: datetime | None = None


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


def lock_holder(locked_by: str | None) -> str | None:
    """The workflow id that holds a lock (the owner part of `owner_token`)."""
    return locked_by.split("/", 1)[0] if locked_by else None


def owner_token(owner: str, identity: str, run_id: str | None = None) -> str:
    """`locked_by` = workflow id / run id / worker identity. Ownership is decided by the workflow
    id alone (the part before the first "/"): a stage retried on another worker, or a new run
    after an operator's Temporal Reset, still recognises the job's lock; the run id and the
    worker identity are kept for diagnostics. Workflow ids never contain "/"."""
    return f"{owner}/{run_id or '-'}/{identity}"[:255]


# What every new job starts with, next to the NewJob fields the create use case chooses.
_NEW_JOB_DEFAULTS = {
    "lifecycle_status": f"'{S.QUEUED}'",
    "status": f"'{LEGACY_STATUS[S.QUEUED]}'",
    "progress": "0",
    "attempt_count": "0",
    "created_at": "now()",
    "updated_at": "now()",
}
_NEW_JOB_FIELDS = [f.name for f in fields(NewJob)]
_INSERT = text(
    f"INSERT INTO ai_job ({', '.join([*_NEW_JOB_FIELDS, *_NEW_JOB_DEFAULTS])}) "
    f"VALUES ({', '.join([*(f':{n}' for n in _NEW_JOB_FIELDS), *_NEW_JOB_DEFAULTS.values()])}) "
    f"RETURNING {JOB_COLUMNS}, pg_notify('ai_job_changed', id::text) IS NULL AS notified, "
    # The job type's rollout as this statement sees it (jobs/creation.py: a create that chose
    # its arm from another view of it is made again): no other statement for it.
    "(SELECT r.id FROM ai_rollout r WHERE r.job_type = :job_type) AS rollout_now"
).bindparams(
    bindparam("input", type_=JSONB),
    bindparam("metadata", type_=JSONB),
    bindparam("concurrency", type_=JSONB),
)


# ---- (new) -> queued --------------------------------------------------------------


async def create(session: AsyncSession, job: NewJob) -> JobRow:
    """Insert a queued job, inside the caller's create transaction; the new row comes back from
    the same statement (its columns as db/jobs.py reads a job), saving a read."""
    return (await create_seeing_rollout(session, job))[0]


async def create_seeing_rollout(
    session: AsyncSession, job: NewJob
) -> tuple[JobRow, uuid.UUID | None]:
    """`create`, and the id of the job type's rollout as the insert saw it (None: none)."""
    row = (await session.execute(_INSERT, job.__dict__)).one()
    fields = dict(row._mapping)
    rollout_now = fields.pop("rollout_now")
    fields.pop("notified")
    return JobRow(**fields), rollout_now


# ---- queued -> running --------------------------------------------------------------


# The CAS queued → running (`lock`), as a constant so EXECUTE can pipeline it with its read.
_LOCK = """
    UPDATE ai_job SET
        lifecycle_status = 'running', status = 'processing',
        locked_by = :token, locked_at = now(),
        lock_until = now() + make_interval(secs => :ttl),
        started_at = coalesce(started_at, now()),
        progress = greatest(progress, 10), updated_at = now(){numbered}
    WHERE id = :id AND (
        lifecycle_status = 'queued'
        OR (lifecycle_status = 'running'
            AND split_part(locked_by, '/', 1) = :owner))
    RETURNING id, job_type, queue_name, locked_by, lock_until,
              (started_at < now()) AS reacquired,
              pg_notify('ai_job_changed', id::text) IS NULL AS notified{call}
    """
LOCK = text(_LOCK.format(numbered="", call=""))
# EXECUTE's take: the lock and the number of the call its new holder may make, in one update of
# the row (`ai_job.call_seq`, the usage row's identity: db/attempts.py).
LOCK_NUMBERED = text(_LOCK.format(numbered=", call_seq = call_seq + 1", call=", call_seq"))


def lock_params(
    job_id: uuid.UUID, *, owner: str, identity: str, ttl_s: int, run_id: str | None = None
) -> dict[str, Any]:
    """`LOCK`'s parameters."""
    return {
        "id": job_id,
        "token": owner_token(owner, identity, run_id),
        "ttl": ttl_s,
        "owner": owner,
    }


async def lock(
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    owner: str,
    identity: str,
    ttl_s: int,
    run_id: str | None = None,
) -> LockedJob:
    """CAS queued → running. A retry by the same workflow (any run of it) finds its own lock
    and succeeds (the UPDATE matches `running` rows it owns); anyone else gets
    `LockConflict`."""
    params = lock_params(job_id, owner=owner, identity=identity, ttl_s=ttl_s, run_id=run_id)
    row = (await session.execute(LOCK, params)).first()
    return await locked_of(session, job_id, dict(row._mapping) if row is not None else None)


async def locked_of(
    session: AsyncSession, job_id: uuid.UUID, row: dict[str, Any] | None
) -> LockedJob:
    """What `LOCK` answered (its row, or None when it matched none): the job locked, or
    `JobNotFound`, `LockConflict` (running under another owner) or `IllegalTransition`."""
    if row is None:
        current = await lock_state(session, job_id)
        if current is None:
            raise JobNotFound()
        status, locked_by = current
        if status == S.RUNNING:
            raise LockConflict(str(job_id), locked_by)
        raise IllegalTransition(str(job_id), status, S.RUNNING)
    return LockedJob(
        id=row["id"],
        job_type=row["job_type"],
        queue_name=row["queue_name"],
        locked_by=row["locked_by"],
        lock_until=row["lock_until"],
        reacquired=bool(row["reacquired"]),
    )


async def extend_lock(
    session: AsyncSession, job_id: uuid.UUID, *, owner: str, ttl_s: int
) -> ExtendResult:
    """The heartbeat: only the owner, only while running. Also reports a pending cancel."""
    row = (
        await session.execute(
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


# ---- running: a cancel requested (no state change) ----------------------------------


async def request_cancel(
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    code: str | None = None,
    superseded_by: uuid.UUID | None = None,
) -> LifecycleStatus:
    """Set cancel_requested_at on a running job (no state change); returns the job's state.
    The caller cancels the workflow after this commits. The first request decides the code the
    job ends with (`code`: flow control's; None: CANCELLED) and the job that replaced it."""
    row = (
        await session.execute(
            text(
                """
                UPDATE ai_job SET
                    cancel_code = CASE WHEN cancel_requested_at IS NULL
                                       THEN CAST(:code AS varchar) ELSE cancel_code END,
                    superseded_by = CASE WHEN cancel_requested_at IS NULL
                                         THEN CAST(:sup AS uuid) ELSE superseded_by END,
                    cancel_requested_at = coalesce(cancel_requested_at, now()),
                    updated_at = now()
                WHERE id = :id AND lifecycle_status = 'running'
                RETURNING lifecycle_status
                """
            ),
            {"id": job_id, "code": code, "sup": superseded_by},
        )
    ).first()
    if row is not None:
        return S(row.lifecycle_status)
    current = await lock_state(session, job_id)
    if current is None:
        raise JobNotFound()
    return S(current[0])


# The stages' hot read, also run pipelined by PREPARE (db/stage_reads.py).
LOCK_STATE = text("SELECT lifecycle_status, locked_by FROM ai_job WHERE id = :id")
# PREPARE's read: the state and lock, and the times flow control arms the workflow's timer for.
PREPARE_STATE = text(
    "SELECT lifecycle_status, locked_by, expires_at, deadline_at FROM ai_job WHERE id = :id"
)


def lock_state_of(row: dict[str, Any]) -> tuple[str, str | None]:
    """(lifecycle status, lock holder token) of a LOCK_STATE row."""
    return str(row["lifecycle_status"]), row["locked_by"]


async def lock_state(s: AsyncSession, job_id: uuid.UUID) -> tuple[str, str | None] | None:
    """A job's lifecycle status and lock holder token, or None when it does not exist."""
    row = (await s.execute(LOCK_STATE, {"id": job_id})).first()
    return lock_state_of(dict(row._mapping)) if row else None


# ---- a running job's bookkeeping: the attempt, the stored output (never its state) ---


# EXECUTE's bookkeeping after a valid answer, pipelined with the call's usage row in its last
# transaction (db/attempts.py `settle`), in one UPDATE of the row: the attempt is recorded (its
# correction hint cleared) whoever holds the job; while `owner` holds it running, its lock is
# extended and, unless a cancel was asked for, the output stored with the items moderation
# dropped, a held answer let go (listeners notified). Its row
# reads as (owned, cancel_requested) through `settled`.
SETTLE_ATTEMPT = text(
    """
    WITH cur AS (
        SELECT id, (lifecycle_status = 'running'
                    AND split_part(locked_by, '/', 1) = :owner) AS owned,
               cancel_requested_at IS NOT NULL AS cancel_requested
        FROM ai_job WHERE id = :id FOR UPDATE
    )
    UPDATE ai_job SET
        attempt_count = greatest(attempt_count, :a),
        correction_hint = NULL,
        lock_until = CASE WHEN cur.owned
            THEN now() + make_interval(secs => :ttl) ELSE lock_until END,
        output = CASE WHEN cur.owned AND NOT cur.cancel_requested
            THEN :out ELSE output END,
        output_hash = CASE WHEN cur.owned AND NOT cur.cancel_requested
            THEN :h ELSE output_hash END,
        progress = CASE WHEN cur.owned AND NOT cur.cancel_requested
            THEN greatest(progress, :p) ELSE progress END,
        flagged_items = CASE WHEN cur.owned AND NOT cur.cancel_requested
            THEN CAST(:flagged AS integer) ELSE flagged_items END,
        held_answer = CASE WHEN cur.owned AND NOT cur.cancel_requested
            THEN NULL ELSE held_answer END,
        updated_at = now()
    FROM cur
    WHERE ai_job.id = cur.id
    RETURNING cur.owned, cur.cancel_requested,
        CASE WHEN cur.owned AND NOT cur.cancel_requested
            THEN pg_notify('ai_job_changed', ai_job.id::text) IS NULL
        END AS notified
    """
).bindparams(bindparam("out", type_=JSONB))


def settle_attempt_params(
    job_id: uuid.UUID,
    *,
    owner: str,
    attempt: int,
    ttl_s: int,
    output: dict[str, Any],
    output_hash: str,
    progress: int,
    flagged: int | None = None,
) -> dict[str, Any]:
    return {
        "id": job_id,
        "owner": owner,
        "a": attempt,
        "ttl": ttl_s,
        "out": output,
        "h": output_hash,
        "p": progress,
        "flagged": flagged,
    }


def settled(row: dict[str, Any] | None) -> tuple[bool, bool]:
    """(owned, cancel_requested) of a SETTLE_ATTEMPT row; no row: the job does not exist."""
    if row is None:
        return False, False
    return bool(row["owned"]), bool(row["cancel_requested"])


async def record_attempt(
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    attempt: int,
    internal_error: str | None,
    correction_hint: str | None = None,
) -> None:
    """An attempt's bookkeeping; `correction_hint` is what the next attempt's prompt is told
    was wrong with this one (None clears it)."""
    await session.execute(
        text(
            """
            UPDATE ai_job SET attempt_count = greatest(attempt_count, :a),
                   -- a late attempt (cancelled after its job ended) never rewrites why it ended
                   internal_error_message = CASE WHEN lifecycle_status IN ('queued', 'running')
                       THEN coalesce(:e, internal_error_message) ELSE internal_error_message END,
                   correction_hint = :c, updated_at = now()
            WHERE id = :id
            """
        ),
        {"id": job_id, "a": attempt, "e": internal_error, "c": correction_hint},
    )
