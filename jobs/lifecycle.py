"""A job's ending: the one home of every terminal transition.

Each function runs in the caller's session (the caller owns the transaction and commits it),
except `succeed` and `outcome`, which take the sessionmaker: PROJECT's transaction reads the job
before it knows what to write, and goes in three round trips on a pooled connection. Each ending
writes two things together: the compare-and-set of `lifecycle_status` (through
`db/endings.py`, with `db/lifecycle.py` the only writer of that column, whose statement
also sends `pg_notify('ai_job_changed', ...)`) and the job's domain event in the outbox
(`db/outbox.py` `outbox.insert_job_event`). Both commit or neither does, so a job that
ends always has its `ai.job.completed`, `ai.job.failed` or `ai.job.cancelled` row, and webhooks
and streams learn of every ending. `tests/unit/test_lifecycle_home.py` fails if a terminal state
is written anywhere else.

- `succeed` (through `succeed_statements`): running → succeeded, by the lock's owner only,
  after the projection; `ai.job.completed` with `jobId`, `jobType`, `outputHash`,
  `artifactCount`.
- `fail`: running → failed; `ai.job.failed` with `jobId`, `jobType`, `errorCode`.
- `cancel`: queued (or running) → cancelled; `ai.job.cancelled` with `jobId`.
- `finalize_failed`: the ending of a job whose execution gave up (a requested cancel wins; a job
  that never ran goes through `running`): one of the two above.

Partial results are kept: `fail`, `cancel` and `finalize_failed` given the catalog end a
long-source job whose chunks partly succeeded with `keep_partial` in the same transaction: the
succeeded chunks' outputs merged (`jobs.chunked.merge_outputs`, cut at the requested count),
projected by the job type's projector (business rows + artifacts) and stored as the job's
output. The terminal state and code still say why it stopped; the job's view shows
`result.partial`. One transaction, so the items are kept exactly when the ending is written.

A CAS that finds another state raises what the repository raises (`IllegalTransition`,
`LockConflict`, `JobNotFound`) and writes no event: whoever ended the job first wrote its one.
Metrics are the callers' business, counted after their commit.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from db import artifacts as artifacts_db
from db import attempts as attempts_db
from db import call_marks as call_marks_db
from db import endings as endings_db
from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db import outbox as outbox_db
from db import relay as relay_db
from db.chunks import store_merged_output, succeeded_chunks
from db.endings import Statement
from db.jobs import JobRow
from db.outbox import CANCELLED, COMPLETED, FAILED
from db.session import SessionMaker
from db.usage import UsageSummary
from engine.errors import (
    ExecutionFailure,
    JobAlreadyCancelled,
    JobNotCancellable,
    public_message_for,
)
from engine.hashing import output_hash
from engine.lifecycle import LifecycleStatus
from jobs.chunked import merge_outputs
from jobs.spec import AnyJobType, Artifact, Catalog, ProjectionContext

log = logging.getLogger(__name__)
# A projection repeated after its job succeeded (a retry whose first answer was lost) writes
# nothing and answers with what exists; the specification marks it `{{##duplicate}}`.
DUPLICATE_PROJECTION_LOG = "{{##duplicate}} projection found the job already succeeded"

# `finalize_failed` takes a never-run job's lock and ends it in the same transaction, so the
# lock's expiry is never read: any TTL does.
_TRANSIENT_LOCK_TTL_S = 60


@dataclass(frozen=True)
class Ending:
    """How `finalize_failed` ended a job: its terminal state, the code it ended with (what
    `job_finished` counts) and its type."""

    status: LifecycleStatus
    code: str
    job_type: str


def succeed_statements(
    job_id: uuid.UUID, *, job_type: str, owner: str, output_hash: str, artifact_count: int
) -> list[Statement]:
    """running → succeeded (only by the lock's `owner`, the job's workflow id), progress 100,
    and `ai.job.completed`, as their two statements (the CAS, then the event) for the caller to
    send in its transaction after the projector's rows and artifacts (`succeed` sends them,
    db/endings.py). The CAS returns no row when it missed: the caller then raises through
    `succeed_missed` (the event goes with the transaction that fails)."""
    return [
        endings_db.mark_succeeded_statement(job_id, owner=owner),
        outbox_db.job_event_statement(
            COMPLETED, job_id, _completed_payload(job_id, job_type, output_hash, artifact_count)
        ),
    ]


async def succeed_missed(s: AsyncSession, job_id: uuid.UUID, *, owner: str) -> NoReturn:
    """Raise what a missed `succeed_statements` CAS means: the job is not this owner's to end,
    or not running (`LockConflict`, `IllegalTransition`, `JobNotFound`)."""
    await endings_db.mark_succeeded_missed(s, job_id, owner=owner)


def _completed_payload(
    job_id: uuid.UUID, job_type: str, digest: str, artifact_count: int
) -> dict[str, Any]:
    return {
        "jobId": str(job_id),
        "jobType": job_type,
        "outputHash": digest,
        "artifactCount": artifact_count,
    }


async def fail(
    s: AsyncSession,
    job_id: uuid.UUID,
    *,
    job_type: str,
    code: str,
    internal_message: str | None = None,
    catalog: Catalog | None = None,
) -> None:
    """running → failed with `code` and its public message, and `ai.job.failed`.
    `internal_message=None` keeps what an attempt already recorded (operators read it). With
    `catalog`, a long-source job keeps what its succeeded chunks produced (`keep_partial`).
    A call its dead attempts sent and never settled is charged first (db/call_marks.py)."""
    await call_marks_db.charge_dead(s, job_id)
    await endings_db.mark_failed(s, job_id, code, public_message_for(code), internal_message)
    await outbox_db.insert_job_event(
        s, FAILED, job_id, {"jobId": str(job_id), "jobType": job_type, "errorCode": code}
    )
    if catalog is not None:
        await keep_partial(s, catalog, job_id)


async def cancel(
    s: AsyncSession,
    job_id: uuid.UUID,
    *,
    only_if_queued: bool = False,
    catalog: Catalog | None = None,
    code: str | None = None,
    superseded_by: uuid.UUID | None = None,
) -> LifecycleStatus:
    """queued|running → cancelled (`only_if_queued`: queued only, the cancel API's rule, since a
    running job is ended by its workflow), and `ai.job.cancelled`. Returns the state the job
    came from. With `catalog`, a long-source job cancelled while running keeps what its
    succeeded chunks produced (`keep_partial`; a queued job has none). Calls still marked
    sent are charged first, as `fail` does (a live attempt's own later record writes nothing).
    `code`: flow control's (SUPERSEDED with the job that replaced it, JOB_EXPIRED,
    JOB_DEADLINE_EXCEEDED); None: the code its cancel request recorded, else CANCELLED."""
    if only_if_queued:
        await endings_db.mark_cancelled_if_queued(s, job_id, code=code, superseded_by=superseded_by)
        came_from = LifecycleStatus.QUEUED
    else:
        await call_marks_db.charge_dead(s, job_id, code="CANCELLED")
        came_from = await endings_db.mark_cancelled(
            s, job_id, code=code, superseded_by=superseded_by
        )
    payload = {"jobId": str(job_id), **({"errorCode": code} if code else {})}
    await outbox_db.insert_job_event(s, CANCELLED, job_id, payload)
    if came_from == LifecycleStatus.QUEUED:  # not dispatched yet: no workflow is ever started
        await relay_db.close_unsent(s, job_id)
    if catalog is not None and came_from == LifecycleStatus.RUNNING:
        await keep_partial(s, catalog, job_id)
    return came_from


async def take(
    s: AsyncSession,
    job_id: uuid.UUID,
    *,
    owner: str,
    identity: str,
    ttl_s: int,
    run_id: str | None,
    dead: tuple[int | None] | None = None,
) -> attempts_db.TakenJob | None:
    """queued → running under `owner`'s lock (a retry by the same workflow finds its own), and
    the job and its snapshot read in the same round trip (db/attempts.py `take`): EXECUTE's
    start. No event: a job's events are its endings. Raises `IllegalTransition` (it ended while
    it waited), `LockConflict` (another owner's) or `JobNotFound`; None: the row was not read.
    `dead`: EXECUTE's `(chunk_no,)` (None: the job's one call), whose dead calls are charged."""
    return await attempts_db.take(
        s, job_id, owner=owner, identity=identity, ttl_s=ttl_s, run_id=run_id, dead_calls_of=dead
    )


async def keep_partial(s: AsyncSession, catalog: Catalog, job_id: uuid.UUID) -> int:
    """In the transaction that ends a long-source job early: merge its succeeded chunks'
    outputs (chunk order, repeats dropped, cut at the requested count), project them with the
    job type's projector and store the merged output. Returns how many artifacts it kept (0
    for a one-call job, a type that does not chunk, or no succeeded chunk). Idempotent like
    every projection: ids come from (job, ordinal)."""
    row = await jobs_db.get(s, job_id)
    if row is None or row.chunk_count is None or row.job_type not in catalog:
        return 0
    try:
        jt = catalog.for_job(row)
    except ExecutionFailure:  # its output schema is gone: nothing can be validated and kept
        return 0
    spec = jt.chunking
    if spec is None:
        return 0
    chunks = await succeeded_chunks(s, job_id)
    if not chunks:
        return 0
    count = int(getattr(jt.input_model.model_validate(row.input), spec.count_field))
    merged = merge_outputs(jt, [c.output for c in chunks], count)
    if not merged.get(spec.items_field):
        return 0
    try:
        out = jt.output_model.model_validate(merged)
    except ValidationError:
        # Each chunk's output was validated on its own; a merge the schema still refuses is
        # not kept rather than blocking the ending (the job ends as it would have).
        log.warning("partial output not kept: invalid merge", extra={"job_id": str(job_id)})
        return 0
    stored = out.model_dump(mode="json")
    digest = output_hash(stored)
    count = await project_artifacts(s, jt, row, out, digest)
    await store_merged_output(s, row.id, output=stored, output_hash=digest)
    return count


def projection_context(row: JobRow, digest: str) -> ProjectionContext:
    """What a projector is told about the job whose output (hashed `digest`) it projects."""
    return ProjectionContext(
        job_id=row.id,
        user_id=row.user_id,
        target_type=row.target_type,
        target_id=row.target_id,
        output_hash=digest,
        input=row.input,
    )


def planned_statements(
    jt: AnyJobType, row: JobRow, out: BaseModel, digest: str
) -> tuple[list[Statement], int]:
    """A type with a planned projector (`JobType.project` unset): its writes, then one artifact
    row per artifact, as statements for the caller's transaction; and how many artifacts."""
    planned = jt.projection(projection_context(row, digest), out)
    return [*planned.writes, *_artifact_rows(row.id, planned.artifacts)], len(planned.artifacts)


def _artifact_rows(job_id: uuid.UUID, artifacts: Sequence[Artifact]) -> list[Statement]:
    """One `ai_job_artifact` insert per artifact a projection wrote."""
    return endings_db.artifact_statements(
        job_id, [(a.artifact_type, a.artifact_id, a.ordinal) for a in artifacts]
    )


async def project_artifacts(
    s: AsyncSession, jt: AnyJobType, row: JobRow, out: BaseModel, digest: str
) -> int:
    """The job type's projector run on a validated output, and one artifact row per thing it
    wrote, in the caller's transaction, one by one (a kept partial result); returns how many.
    Idempotent through the projections' unique keys: projecting the same output again writes
    nothing new."""
    statements, count = planned_statements(jt, row, out, digest)
    await endings_db.write_each(s, statements)
    return count


async def finalize_failed(
    s: AsyncSession,
    job_id: uuid.UUID,
    *,
    code: str,
    owner: str,
    identity: str,
    catalog: Catalog | None = None,
) -> Ending | None:
    """The one ending of a job whose execution gave up with `code` (attempts used up, or a
    code that is never retried). None when the job row is gone.

    - A cancel the user asked for wins over a failure that followed it: a queued or running job
      with `cancel_requested_at` ends `cancelled` (a worker lost during a cancel ends it so).
    - A job that never got as far as `running` (its first EXECUTE transaction never committed)
      is locked by `owner` (the workflow id; `identity` names the worker) and failed in this
      same transaction, so it cannot stay queued behind a closed workflow; the lifecycle table
      has no queued → failed.
    - Otherwise running → failed, keeping the internal message the attempts recorded.

    With `catalog`, a long-source job keeps what its succeeded chunks produced, whichever of
    the two it ends as (`keep_partial`).
    """
    row = await jobs_db.get(s, job_id)
    if row is None:
        return None
    if row.cancel_requested_at is not None and row.lifecycle_status in (
        LifecycleStatus.QUEUED,
        LifecycleStatus.RUNNING,
    ):
        await cancel(s, job_id, catalog=catalog)
        return Ending(LifecycleStatus.CANCELLED, row.cancel_code or "CANCELLED", row.job_type)
    if row.lifecycle_status == LifecycleStatus.QUEUED:
        await lifecycle_db.lock(
            s, job_id, owner=owner, identity=identity, ttl_s=_TRANSIENT_LOCK_TTL_S
        )
    await fail(s, job_id, job_type=row.job_type, code=code, catalog=catalog)
    return Ending(LifecycleStatus.FAILED, code, row.job_type)


@dataclass(frozen=True)
class Success:
    """How `succeed` found or left a job: its state, its artifact count, its type, and the
    usage summed in the transaction that ended it (None when this call did not end it: the job
    had ended before, and nothing was written)."""

    status: str
    artifact_count: int
    job_type: str
    usage: UsageSummary | None = None


def stored_output(jt: AnyJobType, row: JobRow, digest: str) -> BaseModel:
    """The stored output as the job type's model. It must be the one EXECUTE stored (hashed
    `digest`): anything else is `INTERNAL_OUTPUT_MISMATCH`, which no retry can change."""
    if row.output is None or row.output_hash != digest:
        raise ExecutionFailure("INTERNAL_OUTPUT_MISMATCH")
    out: BaseModel = jt.output_model.model_validate(row.output)
    return out


async def succeed(
    sm: SessionMaker, catalog: Catalog, job_id: uuid.UUID, *, output_hash: str, owner: str
) -> Success:
    """The success ending (PROJECT): the job's stored output, checked against `output_hash`,
    becomes its type's business rows and artifacts, then running → succeeded by the lock's
    `owner` with `ai.job.completed` (`succeed_statements`), and the job's usage is summed, all
    in one transaction. Idempotent: a retry after a commit whose result was lost finds the job
    ended and reports it as found (no usage); unique keys make a repeated projection write
    nothing new.

    It takes three round trips on a pooled connection (db/endings.py `succeed_planned`); a job
    found no longer running is reported as found. A CAS that misses raises what the job's state
    says (`IllegalTransition`, `LockConflict`, `JobNotFound`); a job that is gone, or an output
    that is not the stored one, raises `ExecutionFailure` with its final code."""

    def plan(row: JobRow) -> tuple[list[Statement], int] | None:
        jt = catalog.for_job(row)
        if row.lifecycle_status != LifecycleStatus.RUNNING:
            return None  # ended before (a repeated projection, a cancel)
        out = stored_output(jt, row, output_hash)
        statements, count = planned_statements(jt, row, out, output_hash)
        ending = succeed_statements(
            row.id,
            job_type=row.job_type,
            owner=owner,
            output_hash=output_hash,
            artifact_count=count,
        )
        return [*statements, *ending], count

    ended = await endings_db.succeed_planned(sm, job_id, plan)
    if ended.row is None:
        raise ExecutionFailure("INTERNAL_JOB_MISSING")
    if ended.sent:
        if ended.usage is None:  # the CAS running -> succeeded matched no row
            async with sm.begin() as s:
                await succeed_missed(s, job_id, owner=owner)
        succeeded = LifecycleStatus.SUCCEEDED.value
        return Success(succeeded, ended.artifact_count, ended.row.job_type, ended.usage)
    row = ended.row
    if row.lifecycle_status == LifecycleStatus.SUCCEEDED:  # a repeated projection
        log.info(DUPLICATE_PROJECTION_LOG, extra={"job_id": str(job_id), "job_type": row.job_type})
    async with sm.begin() as s:
        return await _as_found(s, row)


async def outcome(sm: SessionMaker, job_id: uuid.UUID) -> Success | None:
    """Where a job stands after another ending won its row (a concurrent PROJECT, a cancel):
    its state and artifact count, no usage; None when the job is gone."""
    async with sm.begin() as s:
        row = await jobs_db.get(s, job_id)
        return await _as_found(s, row) if row is not None else None


async def _as_found(s: AsyncSession, row: JobRow) -> Success:
    arts = await artifacts_db.artifacts(s, [row.id])
    return Success(row.lifecycle_status, len(arts[row.id]), row.job_type)


async def request_cancel(
    s: AsyncSession,
    job_id: uuid.UUID,
    state: LifecycleStatus,
    *,
    code: str | None = None,
    superseded_by: uuid.UUID | None = None,
) -> Literal["cancelled", "cancel_requested"]:
    """The cancel request (the cancel API, an admin's, a bulk cancel's, flow control's), on a
    job the caller read locked (`FOR UPDATE`) in `state`: queued → cancelled at once with
    `ai.job.cancelled` (`cancel`, queued only); running → cancel requested
    (`cancel_requested_at` set, the state unchanged), and the job's workflow ends it; already
    cancelled → `JobAlreadyCancelled`; any other ending → `JobNotCancellable`. Which of the two
    happened is returned. `code` and `superseded_by`: what the job ends with (None:
    CANCELLED)."""
    if state == LifecycleStatus.QUEUED:
        await cancel(s, job_id, only_if_queued=True, code=code, superseded_by=superseded_by)
        return "cancelled"
    if state == LifecycleStatus.RUNNING:
        await lifecycle_db.request_cancel(s, job_id, code=code, superseded_by=superseded_by)
        return "cancel_requested"
    if state == LifecycleStatus.CANCELLED:
        raise JobAlreadyCancelled("The job is already cancelled.")
    raise JobNotCancellable("The job has already finished.")
