"""EXECUTE's two hot transactions, each a named function with a typed result: `take` (the CAS
queued → running and the read of the job and its snapshot, in one round trip) and `settle` (a
valid answer's usage row, what it tells the key's gate and limits, the attempt's bookkeeping and
the output, for a job or for one of its chunks, in one round trip).

The statements are the repositories' own (`db/lifecycle.py` LOCK and SETTLE_ATTEMPT,
`db/jobs.py` GET_WITH_SNAPSHOT, `db/usage.py` INSERT, `db/provider_gate.py` REACHABLE,
`db/provider_limits.py` `settle_statements`) and a chunk's settlement (defined here), sent
through `db/pipeline.py`, which stays private to `db/`: the stage and its use cases see only
these functions and their results.

Attempts are fenced. Each attempt takes the job's lock under its own token (`owner_token`:
workflow id / run id / the attempt's tag and worker), and its one-call settlement and its lock
checks (`extend`) require that exact token: an attempt whose lock a later attempt took over
(Temporal gave up on it, its worker froze) cannot store an answer, and its check before a call
says no. A long source's chunks run concurrently under one workflow, so their calls are fenced
by their chunk's attempt instead: the chunk's `attempt_count` (raised by each attempt's start,
under the chunk's row lock) must still be this attempt's. Each take also numbers the call it
allows (`ai_job.call_seq`): the usage row's identity (job, attempt, chunk, call) is unique and
its insert does nothing on a repeat, so a settlement retried after a commit whose answer was
lost never charges a call twice.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from db import call_marks as call_marks_db
from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db import pauses as pauses_db
from db import pipeline
from db import provider_gate as provider_gate_db
from db import provider_limits as provider_limits_db
from db import structured_downgrades as downgrades_db
from db import usage as usage_db
from db.jobs import JobRow
from db.pauses import InForce
from db.provider_gate import GateKey
from db.provider_limits import LimitSettle
from db.session import SessionMaker
from db.usage import UsageRow


@dataclass(frozen=True)
class TakenJob:
    """What `take` read once the job was this owner's: the row, its unexpired snapshot (None
    once expired or never stored), the number of the call this attempt may make, and how many
    calls of dead attempts (their marks, db/call_marks.py) it charged first."""

    row: JobRow
    snapshot: dict[str, Any] | None
    call_no: int | None = None
    dead_calls_charged: int = 0
    # The structured-output forms lowered now, per (base URL, model): read in the same round
    # trip, so every attempt asks in what the cluster learned (db/structured_downgrades.py).
    downgrades: downgrades_db.Downgrades = field(default_factory=dict)
    # The job was already running (a retry, a chunk after the first): admitted before.
    reacquired: bool = False
    # The operator pauses in force, read after their lock was taken shared (db/pauses.py).
    pauses: tuple[InForce, ...] = ()


@dataclass(frozen=True)
class Fence:
    """Whose attempt holds the job: the workflow (`owner`), the attempt's full lock `token`,
    and for a chunk's call the chunk and the attempt number its row must still carry."""

    job_id: uuid.UUID
    owner: str
    token: str
    attempt: int
    chunk_no: int | None = None


# A one-call attempt's check: its own token still holds the running job (the lock extended).
_EXTEND_OWN = text(
    """
    UPDATE ai_job SET lock_until = now() + make_interval(secs => :ttl), updated_at = now()
    WHERE id = :id AND lifecycle_status = 'running' AND locked_by = :token
    RETURNING cancel_requested_at IS NOT NULL AS cancel_requested
    """
)
# A chunk's attempt's check: the workflow holds the running job and the chunk's latest attempt
# is still this one (not its status: a taken-over attempt's failure may have marked it `failed`
# while its successor runs).
_EXTEND_CHUNK = text(
    """
    UPDATE ai_job SET lock_until = now() + make_interval(secs => :ttl), updated_at = now()
    WHERE id = :id AND lifecycle_status = 'running'
      AND split_part(locked_by, '/', 1) = :owner
      AND EXISTS (SELECT 1 FROM ai_job_chunk c WHERE c.job_id = :id AND c.chunk_no = :n
                  AND c.attempt_count = :a)
    RETURNING cancel_requested_at IS NOT NULL AS cancel_requested
    """
)


async def extend(s: AsyncSession, fence: Fence, *, ttl_s: int) -> tuple[bool, bool]:
    """The attempt's lock check, in the caller's transaction: (still this attempt's, a cancel
    asked for). Still its own: the job's lock is extended by `ttl_s`."""
    if fence.chunk_no is None:
        params: dict[str, Any] = {"id": fence.job_id, "token": fence.token, "ttl": ttl_s}
        row = (await s.execute(_EXTEND_OWN, params)).first()
    else:
        params = {
            "id": fence.job_id,
            "owner": fence.owner,
            "n": fence.chunk_no,
            "a": fence.attempt,
            "ttl": ttl_s,
        }
        row = (await s.execute(_EXTEND_CHUNK, params)).first()
    return (False, False) if row is None else (True, bool(row.cancel_requested))


async def take(
    s: AsyncSession,
    job_id: uuid.UUID,
    *,
    owner: str,
    identity: str,
    ttl_s: int,
    run_id: str | None,
    dead_calls_of: tuple[int | None] | None = None,
) -> TakenJob | None:
    """CAS queued → running (or this workflow's lock, taken over by this attempt: a retry finds
    its predecessor's lock), this attempt's call numbered, and the read of the job and its
    snapshot, pipelined in the caller's transaction: one round trip; the read sees the CAS's
    update and is not used when the CAS matched no row. A missed CAS raises what
    `lifecycle.locked_of` raises (`IllegalTransition`, `LockConflict`, `JobNotFound`); None:
    the job row was not read. `dead_calls_of=(chunk_no,)` (EXECUTE's take: None for a one-call
    job): the marks its dead predecessors left for that chunk are charged in the same round
    trip, before the read (db/call_marks.py), so the row read holds their spend."""
    params = lifecycle_db.lock_params(
        job_id, owner=owner, identity=identity, ttl_s=ttl_s, run_id=run_id
    )
    # The lock and the attempt's call numbered in one update of the row.
    statements: list[pipeline.Statement] = [(lifecycle_db.LOCK_NUMBERED, params)]
    if dead_calls_of is not None:
        charge = call_marks_db.charge_dead_params(
            job_id, chunk_no=dead_calls_of[0], token=params["token"]
        )
        statements.append((call_marks_db.CHARGE_DEAD, charge))
    statements += [
        (jobs_db.GET_WITH_SNAPSHOT, {"id": job_id}),
        (downgrades_db.LIVE, {}),
        # The operator pauses, in the same round trip: the lock, then the read.
        (pauses_db.LOCK_SHARED, {}),
        (pauses_db.IN_FORCE, {}),
    ]
    results = await pipeline.in_session(s, statements)
    locked, read = results[0], results[-4]
    lowered, pauses = results[-3], results[-1]
    taken = await lifecycle_db.locked_of(s, job_id, locked[0] if locked else None)
    found = jobs_db.with_snapshot_of(read[0] if read else None)
    call_no = int(locked[0]["call_seq"]) if locked else None
    dead = int(results[1][0]["charged"]) if dead_calls_of is not None and results[1] else 0
    if found is None:
        return None
    return TakenJob(
        *found,
        call_no=call_no,
        dead_calls_charged=dead,
        downgrades=downgrades_db.downgrades_of(lowered),
        reacquired=taken.reacquired,
        pauses=pauses_db.in_force_of(pauses),
    )


@dataclass(frozen=True)
class Settlement:
    """A valid answer to store: the call's usage row, the gate it went through (the key
    answered: `reachable`), the limits to settle (None: nothing taken, nothing announced) and
    the attempt's output, for the job or for one of its chunks (`chunk_no`)."""

    usage: UsageRow | None
    gate: GateKey | None
    limits: LimitSettle | None
    job_id: uuid.UUID
    owner: str
    attempt: int
    ttl_s: int
    output: dict[str, Any]
    output_hash: str
    chunk_no: int | None = None
    # The attempt's own lock token: a one-call job's output is stored only while it holds the
    # job (None: any attempt of the workflow, as runs recorded before the fence settle).
    token: str | None = None
    # Output items moderation dropped (None: no moderation ran).
    flagged: int | None = None


@dataclass(frozen=True)
class Settled:
    """`owned`: the job was still the owner's, running; `cancel_requested`: a cancel was asked
    for. The output was stored when owned and no cancel was requested."""

    owned: bool
    cancel_requested: bool


# A one-call attempt's settlement fenced by its own token: `lifecycle.SETTLE_ATTEMPT` whose
# owner test is the exact lock token instead of the workflow id.
_WORKFLOW_OWNS = "split_part(locked_by, '/', 1) = :owner"
_SETTLE_OWN = text(
    str(lifecycle_db.SETTLE_ATTEMPT.text).replace(_WORKFLOW_OWNS, "locked_by = :token")
).bindparams(bindparam("out", type_=JSONB))
assert _WORKFLOW_OWNS in str(lifecycle_db.SETTLE_ATTEMPT.text), "SETTLE_ATTEMPT's fence moved"

# A chunk's valid answer, while `owner` holds the job running, the chunk still runs this
# attempt and nobody asked to cancel it: the chunk `succeeded` with its output and hash. The job
# row is locked first (`FOR UPDATE`): chunks of one job settle one after another, so each
# progress counts the ones before it.
_SETTLE_CHUNK = text(
    """
    WITH cur AS (
        SELECT id, (lifecycle_status = 'running'
                    AND split_part(locked_by, '/', 1) = :owner
                    AND EXISTS (SELECT 1 FROM ai_job_chunk k WHERE k.job_id = :job_id
                                AND k.chunk_no = :n AND k.attempt_count = :a)) AS owned,
               cancel_requested_at IS NOT NULL AS cancel_requested
        FROM ai_job WHERE id = :job_id FOR UPDATE
    ), stored AS (
        UPDATE ai_job_chunk c SET status = 'succeeded', output = :out,
            output_hash = :h, error_code = NULL, finished_at = now(),
            flagged_items = CAST(:flagged AS integer), held_answer = NULL,
            attempt_count = greatest(c.attempt_count, :a)
        FROM cur
        WHERE c.job_id = cur.id AND c.chunk_no = :n
          AND cur.owned AND NOT cur.cancel_requested
        RETURNING c.chunk_no
    )
    SELECT cur.owned, cur.cancel_requested, (SELECT count(*) FROM stored) AS stored
    FROM cur
    """
).bindparams(bindparam("out", type_=JSONB))
# Then, under the same conditions (the row is still locked by `_SETTLE_CHUNK`, so they read the
# same): the job's lock extended, its attempt bookkeeping, its progress raised to
# 10 + 80 x chunks succeeded / chunks (a second statement: it sees the chunk the first one
# marked succeeded), and its listeners notified (`ai_job_changed`).
_SETTLE_CHUNK_JOB = text(
    """
    UPDATE ai_job SET
        attempt_count = greatest(attempt_count, :a),
        correction_hint = NULL,
        lock_until = now() + make_interval(secs => :ttl),
        progress = greatest(progress, 10 + (80 * (
            SELECT count(*) FROM ai_job_chunk
            WHERE job_id = :job_id AND status = 'succeeded'
        ) / greatest(coalesce(chunk_count, 1), 1))::int),
        flagged_items = (SELECT sum(flagged_items) FROM ai_job_chunk WHERE job_id = :job_id),
        updated_at = now()
    WHERE id = :job_id AND lifecycle_status = 'running'
      AND split_part(locked_by, '/', 1) = :owner AND cancel_requested_at IS NULL
    RETURNING pg_notify('ai_job_changed', id::text) IS NULL AS notified
    """
)


def _settle_output(st: Settlement) -> list[pipeline.Statement]:
    """The attempt's bookkeeping and output: the job's one UPDATE, or a chunk's two."""
    if st.chunk_no is None:
        params = lifecycle_db.settle_attempt_params(
            st.job_id,
            owner=st.owner,
            attempt=st.attempt,
            ttl_s=st.ttl_s,
            output=st.output,
            output_hash=st.output_hash,
            progress=60,
            flagged=st.flagged,
        )
        if st.token is None:
            return [(lifecycle_db.SETTLE_ATTEMPT, params)]
        return [(_SETTLE_OWN, {**params, "token": st.token})]
    chunk = {"job_id": st.job_id, "n": st.chunk_no, "owner": st.owner, "a": st.attempt}
    stored = {**chunk, "out": st.output, "h": st.output_hash, "flagged": st.flagged}
    job = {"job_id": st.job_id, "owner": st.owner, "a": st.attempt, "ttl": st.ttl_s}
    return [(_SETTLE_CHUNK, stored), (_SETTLE_CHUNK_JOB, job)]


def _statements(st: Settlement) -> tuple[list[pipeline.Statement], int]:
    """The settlement in order (the usage row, the gate's `reachable`, the attempt's
    bookkeeping and output, the limits' end), and the index of the statement whose row says
    (owned, cancel_requested)."""
    statements: list[pipeline.Statement] = []
    if st.usage is not None:  # None: a held answer, whose call was charged when it answered
        statements.append((usage_db.INSERT, st.usage.__dict__))
    if st.gate is not None:
        statements.append((provider_gate_db.REACHABLE, st.gate.params()))
    settle_at = len(statements)
    statements.extend(_settle_output(st))
    if st.limits is not None:
        statements.extend(provider_limits_db.settle_statements(st.limits))
    return statements, settle_at


async def settle(sm: SessionMaker, st: Settlement) -> Settled:
    """The last transaction of a paid call, committed in every outcome: BEGIN, its statements
    and COMMIT in one round trip (db/pipeline.py `run`)."""
    statements, at = _statements(st)
    rows = (await pipeline.run(sm, statements, commit=True))[at]
    return Settled(*lifecycle_db.settled(rows[0] if rows else None))
