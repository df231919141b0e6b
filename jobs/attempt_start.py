"""The start of an EXECUTE attempt, in its first transaction: the job taken (`jobs/lifecycle.py`
`take`), the chunk it calls for locked, an output already paid for found, then the call's
provider admission (`jobs/admission.py` `admit`) and, for a chunk, its attempt counted.

The attempt takes the job under its OWN identity (`Start.token`: the workflow id, the run id, the
chunk and attempt number, the worker), not the workflow's: a retried attempt takes over its
predecessor's lock (it timed out, its worker died), and from then on the predecessor's lock
checks and settlement are refused (db/attempts.py `Fence`), so it can neither start a call nor
store a late answer. The take also numbers the attempt's call (its usage row's identity).

The take charges, before anything else, the calls the attempt's dead predecessors sent and never
settled (their "call sent" marks, db/call_marks.py), so the admission's cost cover counts them;
an admitted call's own mark is written last, in the same transaction, before the call goes out.

`start` answers what the attempt does next; the caller (activities/execute.py) owns the
transaction: it commits a `Started`, `Ended` or `Reused`, and rolls back on a `Wait`, `Refused`
or `Stop` (nothing taken, no attempt spent, the job still `queued` when this attempt took it).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from db import attempts as attempts_db
from db import call_marks as call_marks_db
from db import chunks as chunks_db
from db import lifecycle as lifecycle_db
from db.attempts import Fence
from db.chunks import ChunkRow
from db.jobs import JobRow
from db.pauses import InForce
from db.session import SessionMaker
from engine.errors import ExecutionFailure, IllegalTransition, JobNotFound, LockConflict
from jobs import admission, call_marks, fallback, flow, offpeak, pauses
from jobs import lifecycle as lifecycle
from jobs.admission import AdmissionConfig, Refused, Ticket
from jobs.gateway import Gateway
from jobs.spec import AnyJobType, Catalog
from jobs.waits import Wait


@dataclass(frozen=True)
class Start:
    """Whose attempt: the job, the lock's owner (and its token's parts), the lock's TTL, the
    chunk (None: the job's one call), the attempt number and the job's timeout."""

    job_id: uuid.UUID
    owner: str
    identity: str
    ttl_s: int
    run_id: str | None
    chunk_no: int | None
    attempt: int
    timeout_ms: int

    @property
    def attempt_identity(self) -> str:
        """The lock's identity part for this attempt: its chunk and number, then the worker."""
        chunk = f"c{self.chunk_no}" if self.chunk_no is not None else ""
        return f"{chunk}a{self.attempt}@{self.identity}"

    @property
    def token(self) -> str:
        """The attempt's full lock token (`ai_job.locked_by` while it holds the job)."""
        return lifecycle_db.owner_token(self.owner, self.attempt_identity, self.run_id)

    @property
    def fence(self) -> Fence:
        return Fence(self.job_id, self.owner, self.token, self.attempt, self.chunk_no)


@dataclass(frozen=True)
class Ended:
    """The job ended before it could run (cancelled while it waited, or done): its state."""

    status: str


@dataclass(frozen=True)
class Reused:
    """An output this job (or chunk) already stored: paid for, not bought again."""

    output_hash: str


@dataclass(frozen=True)
class Stop:
    """The attempt cannot run and never will: the code it fails with for good."""

    code: str


@dataclass(frozen=True)
class Held:
    """An answer this job (or chunk) was given and paid for, kept because its moderation could
    not run (jobs/guardrails.py): moderated again, never bought again. No admission: no call."""

    row: JobRow
    snapshot: dict[str, Any]
    jt: AnyJobType
    chunk: ChunkRow | None
    answer: str
    fence: Fence | None = None


@dataclass(frozen=True)
class Expire:
    """The job's start-by time (before it was admitted) or its deadline passed: no call; it
    ends with `code` (jobs/flow.py `expire`, after this transaction rolled back)."""

    code: str


@dataclass(frozen=True)
class Started:
    """The call may go: the job as read, its snapshot, its type, its chunk and what admission
    granted (to be settled by the call's end); the attempt's fence (its lock checks and its
    settlement) and its call's number (its usage row's identity)."""

    row: JobRow
    snapshot: dict[str, Any]
    jt: AnyJobType
    chunk: ChunkRow | None
    ticket: Ticket
    fence: Fence | None = None
    call_no: int | None = None
    # The structured-output forms lowered now (db/structured_downgrades.py), read with the take.
    downgrades: Mapping[tuple[str, str], str] = field(default_factory=dict)


async def holds(sm: SessionMaker, fence: Fence, *, ttl_s: int) -> bool:
    """The attempt's lock check (and extension), in a transaction of its own: still this
    attempt's job (or chunk) and no cancel asked for."""
    async with sm.begin() as s:
        ours, cancel_requested = await attempts_db.extend(s, fence, ttl_s=ttl_s)
    return ours and not cancel_requested


def may_be_taken_over(heartbeat_timeout: dt.timedelta | None, elapsed_s: float) -> bool:
    """Whether a later attempt may hold the job by now, so this one must check its lock right
    before it sends its call: Temporal starts a later attempt only once this one timed out, at
    the earliest its heartbeat timeout after it started. Within half of that (every attempt
    that was not stalled) no check is needed, and the call costs no extra round trip."""
    if heartbeat_timeout is None:
        return True
    return elapsed_s >= heartbeat_timeout.total_seconds() / 2


async def start(
    s: AsyncSession, gateway: Gateway, catalog: Catalog, cfg: AdmissionConfig, st: Start
) -> Started | Held | Ended | Reused | Stop | Wait | Refused | Expire:
    """The attempt's first transaction, in the caller's session, in that order: take, chunk,
    reuse, an answer held for moderation, an operator pause, the start-by time and deadline
    (jobs/pauses.py, jobs/flow.py), an off-peak job's window (jobs/offpeak.py `gate`),
    admission, the chunk's attempt (after every check that rolls back: only an attempt that
    runs is counted)."""
    try:
        taken = await lifecycle.take(
            s,
            st.job_id,
            owner=st.owner,
            identity=st.attempt_identity,
            ttl_s=st.ttl_s,
            run_id=st.run_id,
            # A call a dead attempt of this chunk (or job) sent is charged before admission.
            dead=(st.chunk_no,),
        )
    except IllegalTransition as exc:
        return Ended(str(exc.from_status))
    except LockConflict:
        return Stop("INTERNAL_NOT_LOCK_OWNER")
    except JobNotFound:
        return Stop("INTERNAL_JOB_MISSING")
    if taken is None:
        return Stop("INTERNAL_JOB_MISSING")
    row, snapshot = taken.row, taken.snapshot
    if row.cancel_requested_at is not None:
        return Stop("CANCELLED")
    chunk = None
    if st.chunk_no is not None:
        # Locked until the commit: a retry racing a lost attempt of the same chunk decides on
        # its status after this one.
        chunk = await chunks_db.get_for_update(s, st.job_id, st.chunk_no)
        if chunk is None:
            return Stop("INTERNAL_CHUNK_MISSING")
        if chunk.status == "succeeded" and chunk.output_hash is not None:
            return Reused(chunk.output_hash)
    elif row.output_hash is not None and row.output is not None:
        return Reused(row.output_hash)
    if snapshot is None:
        return Stop("INTERNAL_SNAPSHOT_MISSING")
    try:
        jt = catalog.for_job(row)  # the versions it was created with, on every attempt
    except ExecutionFailure as f:
        return Stop(f.code)
    answer = chunk.held_answer if chunk is not None else row.held_answer
    if answer is not None:  # paid for, waiting for its moderation: no call, no admission
        if chunk is not None:
            await chunks_db.start_attempt(s, st.job_id, chunk.chunk_no, st.attempt)
        return Held(row, snapshot, jt, chunk, answer, st.fence)
    now = dt.datetime.now(dt.UTC)
    paused = _paused(gateway, jt, row, taken.pauses)
    if paused is not None:  # rolled back: the job stays as it was, no attempt spent
        return paused
    code = flow.expiry_at_start(row, admitted_before=taken.reacquired, now=now)
    if code is not None:
        return Expire(code)
    held = offpeak.gate(gateway, jt, row, now)
    if held is not None:  # an off-peak job outside its window: wait for it, or its deadline
        return Stop(held) if isinstance(held, str) else held
    got = await fallback.admit(
        s, gateway, cfg, admission.Call(row, jt, chunk, st.timeout_ms, taken.pauses)
    )
    if not isinstance(got, Ticket):
        return got
    if chunk is not None:
        await chunks_db.start_attempt(s, st.job_id, chunk.chunk_no, st.attempt)
    if got.key_failure is None and taken.call_no is not None:
        # The call will be sent: its mark commits with this transaction, before it goes out.
        await call_marks_db.mark_sent(
            s, _mark(gateway, cfg, row, jt, chunk, snapshot, got, taken.call_no, st.attempt)
        )
    return Started(row, snapshot, jt, chunk, got, st.fence, taken.call_no, taken.downgrades)


def _paused(
    gateway: Gateway, jt: AnyJobType, row: JobRow, in_force: tuple[InForce, ...]
) -> Wait | None:
    """An operator pause of the job's call, the first check before it (docs/limits.md). A
    job of a rollout arm tries its arm's model first and its primary next: each is looked at
    where the call goes (jobs/fallback.py `admit_entry`, jobs/admission.py `admit`), so the
    job is held only when neither may go."""
    if not in_force or fallback.arm_entry(gateway, jt, row) is not None:
        return None
    return pauses.held(
        in_force,
        job_type=row.job_type,
        provider=gateway.provider_for(jt, row.credential_mode).name,
        model=gateway.model_for(jt, row.credential_mode),
        user_id=row.user_id,
    )


def _mark(
    gateway: Gateway,
    cfg: AdmissionConfig,
    row: JobRow,
    jt: AnyJobType,
    chunk: ChunkRow | None,
    snapshot: dict[str, Any],
    ticket: Ticket,
    call_no: int,
    attempt: int,
) -> call_marks_db.CallMark:
    """The call's mark: to the model the admitted call goes to (the primary, or the fallback
    entry the gate sent it to, as activities/fallback.py `Route.start` picks it)."""
    entry = fallback.entry_of(gateway, ticket)
    if entry is None:
        provider = gateway.provider_for(jt, row.credential_mode).name
        model = gateway.model_for(jt, row.credential_mode)
    else:
        provider, model = gateway.fallbacks.providers[entry.position].name, entry.model
    return call_marks.sent_mark(
        gateway.prices,
        row=row,
        jt=jt,
        chunk=chunk,
        call_no=call_no,
        attempt=attempt,
        provider=provider,
        model=model,
        prompt_tokens=call_marks.prompt_estimate(jt, row, chunk, snapshot),
        margin=cfg.estimate_margin,
        tier=offpeak.call_tier(gateway, jt, row, dt.datetime.now(dt.UTC)),
    )
