"""A job's terminal transitions (running → succeeded | failed, queued | running → cancelled),
and the transactions that end a job successfully. With db/lifecycle.py (the insert, the lock,
the cancel request), the only code that writes `ai_job.lifecycle_status`; jobs/lifecycle.py is
the one caller, so each ending goes with its outbox event.

Every transition is one compare-and-set UPDATE that also shadow-writes the legacy `status`
column, sets `finished_at` and releases the lock. When the CAS matches no row, a follow-up read
names the state that was found, and a typed error is raised (`IllegalTransition`,
`LockConflict`, `JobNotFound`). The `ai_job_lifecycle_guard` trigger enforces the same table
underneath.

Every function runs in the session it is given and never commits, except `succeed_planned`:
PROJECT's usual transaction, which opens its own on a pooled connection so that it costs three
round trips (db/pipeline.py), and commits only when the CAS matched.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncSession

from db import jobs as jobs_db
from db import pipeline
from db.artifacts import INSERT_ARTIFACT, artifact_params
from db.jobs import JobRow
from db.lifecycle import lock_state
from db.session import SessionMaker
from db.usage import SUMMARY, UsageSummary, summary_of
from engine.errors import IllegalTransition, JobNotFound, LockConflict, public_message_for
from engine.flow import FLOW_CODES
from engine.lifecycle import LEGACY_STATUS, LifecycleStatus, is_legal

S = LifecycleStatus
# A statement and its parameters, as the ending's callers build them for one pipelined batch.
Statement = pipeline.Statement


_SUCCEEDED_SETS = "progress = 100"
# A cancel ends a job with the code it was given (flow control: SUPERSEDED, JOB_EXPIRED,
# JOB_DEADLINE_EXCEEDED), else the code its cancel request recorded (`cancel_code`), else
# CANCELLED; the public message is that code's (code constants, never input).
_CODE = "coalesce(CAST(:code AS varchar), cancel_code, 'CANCELLED')"
_MESSAGES = " ".join(
    "WHEN '{}' THEN '{}'".format(code, public_message_for(code).replace("'", "''"))
    for code in sorted(FLOW_CODES)
)
_CANCELLED_SETS = (
    f"error_code = {_CODE}, "
    f"public_error_message = CASE {_CODE} {_MESSAGES} "
    f"ELSE '{public_message_for('CANCELLED')}' END, "
    "cancel_requested_at = coalesce(cancel_requested_at, now()), "
    "superseded_by = coalesce(CAST(:superseded_by AS uuid), superseded_by)"
)


@functools.cache
def _transition_stmt(with_owner: bool, extra: str) -> TextClause:
    owner_clause = " AND split_part(locked_by, '/', 1) = :owner" if with_owner else ""
    sets = f", {extra}" if extra else ""
    return text(
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


# ---- running -> terminal ------------------------------------------------------------


def mark_succeeded_statement(
    job_id: uuid.UUID, *, owner: str | None = None
) -> tuple[TextClause, dict[str, Any]]:
    """running → succeeded (progress 100), only by `owner` when given, as a statement for the
    success ending to pipeline: no row back means it missed, and `mark_succeeded_missed` then
    says why."""
    return transition_statement(
        job_id, (S.RUNNING,), S.SUCCEEDED, owner=owner, extra=_SUCCEEDED_SETS
    )


async def mark_succeeded_missed(
    session: AsyncSession, job_id: uuid.UUID, *, owner: str | None = None
) -> NoReturn:
    await transition_missed(session, job_id, (S.RUNNING,), S.SUCCEEDED, owner=owner)


async def mark_failed(
    session: AsyncSession,
    job_id: uuid.UUID,
    code: str,
    public_message: str,
    internal_message: str | None = None,
    *,
    owner: str | None = None,
) -> None:
    """running → failed. `internal_message=None` keeps what an attempt already recorded."""
    await _transition(
        session,
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
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    code: str | None = None,
    superseded_by: uuid.UUID | None = None,
) -> LifecycleStatus:
    """queued|running → cancelled with `code` (None: the code its cancel request recorded, else
    CANCELLED); returns the state it came from."""
    return await _transition(
        session,
        job_id,
        (S.QUEUED, S.RUNNING),
        S.CANCELLED,
        extra=_CANCELLED_SETS,
        params={"code": code, "superseded_by": superseded_by},
    )


async def mark_cancelled_if_queued(
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    code: str | None = None,
    superseded_by: uuid.UUID | None = None,
) -> None:
    """The cancel API's CAS: queued → cancelled only (running jobs end in their workflow), with
    `code` (None: CANCELLED) and the job that replaced it (`superseded_by`)."""
    await _transition(
        session,
        job_id,
        (S.QUEUED,),
        S.CANCELLED,
        extra=_CANCELLED_SETS,
        params={"code": code, "superseded_by": superseded_by},
    )


async def _transition(
    s: AsyncSession,
    job_id: uuid.UUID,
    from_states: Sequence[LifecycleStatus],
    to: LifecycleStatus,
    *,
    owner: str | None = None,
    extra: str = "",
    params: dict[str, Any] | None = None,
) -> LifecycleStatus:
    stmt, values = transition_statement(
        job_id, from_states, to, owner=owner, extra=extra, params=params
    )
    row = (await s.execute(stmt, values)).first()
    if row is None:
        await transition_missed(s, job_id, from_states, to, owner=owner)
    return S(row.from_status)


def transition_statement(
    job_id: uuid.UUID,
    from_states: Sequence[LifecycleStatus],
    to: LifecycleStatus,
    *,
    owner: str | None = None,
    extra: str = "",
    params: dict[str, Any] | None = None,
) -> tuple[TextClause, dict[str, Any]]:
    """The CAS of `_transition` and its parameters (its caller may pipeline it, db/pipeline.py);
    it returns one row (`from_status`) when it matched, none otherwise, and then
    `transition_missed` says why."""
    for f in from_states:
        assert is_legal(f, to), f"{f} -> {to} is not in the transition table"
    values = {
        "id": job_id,
        "to": str(to),
        "legacy": LEGACY_STATUS[to],
        "from_states": [str(f) for f in from_states],
        "owner": owner,
        **(params or {}),
    }
    return _transition_stmt(bool(owner), extra), values


async def transition_missed(
    s: AsyncSession,
    job_id: uuid.UUID,
    from_states: Sequence[LifecycleStatus],
    to: LifecycleStatus,
    *,
    owner: str | None = None,
) -> NoReturn:
    """A transition's CAS matched no row: raise what the job's state says."""
    current = await lock_state(s, job_id)
    if current is None:
        raise JobNotFound()
    status, locked_by = current
    if owner and status in from_states:
        # The state matched but the lock belongs to another workflow: not ours to finish.
        raise LockConflict(str(job_id), locked_by)
    raise IllegalTransition(str(job_id), status, to)


# ---- the success ending's transactions ----------------------------------------------


def artifact_statements(
    job_id: uuid.UUID, artifacts: Sequence[tuple[str, str, int]]
) -> list[Statement]:
    """One `ai_job_artifact` insert per (artifact type, artifact id, ordinal) a projection
    wrote; a repeated one writes nothing (its unique key)."""
    return [(INSERT_ARTIFACT, artifact_params(job_id, t, a, o)) for t, a, o in artifacts]


async def write_each(s: AsyncSession, statements: Sequence[Statement]) -> None:
    """`statements` one by one in the caller's transaction (a kept partial result's rows)."""
    for stmt, params in statements:
        await s.execute(stmt, params)


@dataclass(frozen=True)
class PlannedEnding:
    """What `succeed_planned` found and did."""

    row: JobRow | None  # the job as the transaction first read it (None: it is gone)
    sent: bool  # the plan's statements were sent (the plan did not decline)
    artifact_count: int  # how many artifacts the plan wrote (0 when not sent)
    usage: UsageSummary | None  # the job's usage, when the CAS matched and the commit was made


async def succeed_planned(
    sm: SessionMaker,
    job_id: uuid.UUID,
    plan: Callable[[JobRow], tuple[Sequence[Statement], int] | None],
) -> PlannedEnding:
    """PROJECT's usual transaction, in three round trips on a pooled connection: BEGIN with the
    job's read; `plan(job)`'s statements (a planned projection's writes and artifacts, then
    the CAS running → succeeded and its event, the last two) with the job's usage summary;
    COMMIT. Nothing is committed when the job is gone, `plan` declines (None: the caller takes
    another path) or raises, or the CAS matched no row (`usage` None: the caller asks why)."""
    async with pipeline.transaction(sm) as tx:
        [found] = await tx.run([(jobs_db.GET, {"id": job_id})])
        row = jobs_db.row_of(found)
        planned = plan(row) if row is not None else None
        if planned is None:
            return PlannedEnding(row, sent=False, artifact_count=0, usage=None)
        statements, count = planned
        *_, cas, _event, summary = await tx.run([*statements, (SUMMARY, {"id": job_id})])
        if not cas:
            return PlannedEnding(row, sent=True, artifact_count=count, usage=None)
        await tx.commit()
        return PlannedEnding(row, sent=True, artifact_count=count, usage=summary_of(summary[0]))
