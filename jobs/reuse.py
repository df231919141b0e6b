"""Result reuse within one user: a create that allows it, of a type that permits it, whose
request was already answered (or is being answered) for the same user, makes no provider call.

- The key (`reuse_key`, pure): sha256 of the job type, the normalized input's hash, the prompt
  version, the model the job will run on and the output schema version: what decides the
  answer. Set on every create of a type that permits reuse (`ServiceSpec.reuse`), so a later
  create that allows reuse finds it.
- At create (`attach`, in the create's transaction, under the user's create lock, so two
  identical creates are serialised and the second sees the first): the newest of the SAME
  user's jobs with the key that succeeded (its answer still held) or is still queued/running
  becomes the job's `reused_from_job_id` (a job that itself waits on a source: its source,
  the root). A source that already succeeded makes the job free: nothing is reserved.
- At run (`step`, the `reuse` stage's one transaction): a source that succeeded gives its
  stored answer and hash to the job (taken queued → running, its own output row; PROJECT then
  writes its own business rows and artifacts; no usage row); a source still active: wait
  (nothing taken); a source that ended without an answer (failed, cancelled, purged, gone)
  gives way to the next of the user's jobs with the key that can still answer (looked up under
  the user's create lock, never one that waits on a source already tried, so waiters never form
  a cycle), else the job makes its own call: of the jobs that waited on a failed source, one
  makes the call and the others wait for it. A source still held back by the user's dispatch
  window is not waited for (this job went first: waiting in the window for a job the window
  holds would never end): the job makes its own call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy.ext.asyncio import AsyncSession

from db import budgets as budgets_db
from db import job_output as job_output_db
from db import reuse as reuse_db
from db.lifecycle import NewJob, lock_holder
from db.session import SessionMaker
from engine.errors import ExecutionFailure
from engine.hashing import canonical_json
from engine.lifecycle import TERMINAL_VALUES, LifecycleStatus
from jobs import lifecycle

if TYPE_CHECKING:
    from jobs.requests import CheckedRequest

S = LifecycleStatus
# The progress a job shows once its answer is copied (PROJECT makes it 100), as MERGE's.
COPIED_PROGRESS = 90


def reuse_key(
    job_type: str,
    normalized_input: Any,
    prompt_version: str,
    model: str,
    output_schema_version: str,
) -> str:
    """What decides a job's answer, hashed (hex sha256): two creates with the same key ask the
    same model the same prompt for the same schema. Pure."""
    input_hash = hashlib.sha256(canonical_json(normalized_input).encode()).hexdigest()
    parts = [job_type, input_hash, prompt_version, model, output_schema_version]
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()


def key_for(checked: CheckedRequest, model: str) -> str | None:
    """The reuse key of a checked create whose job runs on `model`; None: its type permits no
    reuse (no key is stored, no lookup can find it)."""
    d = checked.job_type.definition
    if not d.service.reuse:
        return None
    return reuse_key(
        d.job_type,
        checked.normalized,
        checked.prompt_version or d.prompt_version,
        model,
        d.output.schema_version,
    )


Lock = Callable[[AsyncSession, str], Awaitable[None]]


def patient(service_tier: str) -> bool:
    """May a reuser of this tier wait on a source that is still active whatever its tier? A
    standard job may not: it never waits on a batch, off-peak or delayed source (hours away,
    maybe); it waits only on a standard one that is due, and otherwise makes its own call.
    A batch or off-peak job waits on any (it is slow itself)."""
    return service_tier != "standard"


async def attach(
    s: AsyncSession, new: NewJob, checked: CheckedRequest, lock: Lock
) -> tuple[NewJob, CheckedRequest]:
    """A create that allows reuse, in its transaction: the user's create lock taken (`lock`,
    before the lookup: a concurrent identical create commits first or waits for this one),
    then the source found by the same user's key. With a source that already succeeded the
    job is free: its reservation and the estimate its budgets are checked with are 0."""
    if new.reuse_key is None or not new.reuse_allowed:
        return new, checked
    await lock(s, new.user_id)
    found = await reuse_db.candidate(
        s,
        user_id=new.user_id,
        job_type=new.job_type,
        reuse_key=new.reuse_key,
        patient=patient(new.service_tier),
    )
    if found is None:
        return new, checked
    if found.lifecycle_status != S.SUCCEEDED:
        root = found.reused_from_job_id or found.id  # wait on the root, not on a waiter
        return dataclasses.replace(new, reused_from_job_id=root), checked
    free = dataclasses.replace(
        checked.estimate, estimated_cost_usd=Decimal(0), worst_case_cost_usd=Decimal(0)
    )
    return (
        dataclasses.replace(new, reused_from_job_id=found.id, reserved_cost_usd=Decimal(0)),
        dataclasses.replace(checked, estimate=free),
    )


@dataclass(frozen=True)
class Step:
    """What the `reuse` stage found: `copied` (the job's answer is the source's, `output_hash`;
    the job is running), `wait` (the source is still active; the job stays queued), `run` (no
    source to reuse: the job makes its own call) or `ended` (the job ended before: its state)."""

    action: Literal["copied", "wait", "run", "ended"]
    output_hash: str = ""
    lifecycle_status: str = ""
    look_again: bool = False  # `wait` on a source found just now: look again soon, too


async def step(
    s: AsyncSession,
    job_id: uuid.UUID,
    *,
    owner: str,
    identity: str,
    ttl_s: int,
    run_id: str | None,
) -> Step | None:
    """The `reuse` stage's transaction (the caller commits): the job read locked, then its
    source; a succeeded source's answer copied onto the job taken by `owner` (jobs/lifecycle.py
    `take`, as EXECUTE's). Idempotent: a retry after a commit whose answer was lost finds the
    copy under its own lock. None: the job is gone."""
    me = await reuse_db.job(s, job_id)
    if me is None:
        return None
    if me.lifecycle_status == S.RUNNING and lock_holder(me.locked_by) == owner and me.output_hash:
        return Step("copied", output_hash=me.output_hash)
    if me.lifecycle_status in TERMINAL_VALUES:
        return Step("ended", lifecycle_status=me.lifecycle_status)
    if me.lifecycle_status != S.QUEUED or me.reused_from_job_id is None:
        return Step("run")
    source_id: uuid.UUID = me.reused_from_job_id
    src = await reuse_db.source(s, source_id, user_id=me.user_id)
    tried = [job_id]
    for _ in range(MAX_SOURCES):
        if src is not None and src.lifecycle_status in (S.QUEUED, S.RUNNING) and not src.held:
            # A source found just now may end before this commit, unseen by its ending's NOTIFY
            # (which looks for the jobs waiting on it): the workflow looks again soon as well.
            moved = await _point_at(s, me, source_id)
            return Step("wait", look_again=moved)
        if src is not None and _answered(src):
            await _point_at(s, me, source_id)
            return await _copy(s, job_id, src, owner, identity, ttl_s, run_id)
        if src is not None and src.held:
            # Its user's dispatch window holds it back while this job went first (by its
            # priority): waiting in the window for a job the window holds would never end.
            break
        # Failed, cancelled, purged or gone: another of the user's jobs with the key may still
        # answer (the newest one that does not wait on a source already tried).
        tried.append(source_id)
        found = await _another_source(s, me, tried)
        if found is None:
            break
        source_id = found
        src = await reuse_db.source(s, source_id, user_id=me.user_id, share=False)
    # Nothing to reuse: the job pays its own call.
    await reuse_db.set_source(s, job_id, None)
    return Step("run")


# How many sources one `reuse` stage looks at before the job makes its own call.
MAX_SOURCES = 4


def _answered(src: reuse_db.SourceAnswer) -> bool:
    """The source succeeded and its answer is still held (not purged)."""
    return src.lifecycle_status == S.SUCCEEDED and bool(src.output) and bool(src.output_hash)


async def _point_at(s: AsyncSession, me: reuse_db.JobReuse, source_id: uuid.UUID) -> bool:
    """The job's `reused_from_job_id` names the source it waits on or copies; True: moved."""
    if source_id == me.reused_from_job_id:
        return False
    await reuse_db.set_source(s, me.id, source_id)
    return True


async def _another_source(
    s: AsyncSession, me: reuse_db.JobReuse, tried: list[uuid.UUID]
) -> uuid.UUID | None:
    """Under the user's create lock (a create, and another job's stage, see the same rows):
    the user's newest job with the key that succeeded or is active, none of `tried` nor waiting
    on one of them; an active one that waits on a source gives that source (the root)."""
    if me.reuse_key is None:
        return None
    await budgets_db.lock_user(s, me.user_id)
    found = await reuse_db.candidate(
        s,
        user_id=me.user_id,
        job_type=me.job_type,
        reuse_key=me.reuse_key,
        excluding=tried,
        patient=patient(me.service_tier),
    )
    if found is None:
        return None
    if found.lifecycle_status == S.SUCCEEDED:
        return found.id
    return found.reused_from_job_id or found.id


async def _copy(
    s: AsyncSession,
    job_id: uuid.UUID,
    src: reuse_db.SourceAnswer,
    owner: str,
    identity: str,
    ttl_s: int,
    run_id: str | None,
) -> Step:
    """The source's stored answer and hash become the job's own, the job taken by `owner`."""
    assert src.output is not None and src.output_hash is not None
    await lifecycle.take(s, job_id, owner=owner, identity=identity, ttl_s=ttl_s, run_id=run_id)
    stored = await job_output_db.store_output(
        s,
        job_id,
        owner=owner,
        output=src.output,
        output_hash=src.output_hash,
        progress=COPIED_PROGRESS,
        flagged=src.flagged_items,
    )
    if not stored:  # taken just now under the row's lock: cannot happen
        raise ExecutionFailure("INTERNAL_NOT_LOCK_OWNER")
    return Step("copied", output_hash=src.output_hash)


async def dependents(sm: SessionMaker, source_id: uuid.UUID) -> list[str]:
    """The workflow ids of the queued jobs that wait on `source_id` (the reuse waker signals
    them when it heard the source end)."""
    async with sm.begin() as s:
        return await reuse_db.waiting_on(s, source_id)


async def stranded(sm: SessionMaker) -> list[str]:
    """The workflow ids of every queued job whose source has ended (the waker's sweep after it
    (re)connected: a NOTIFY sent while nobody listened is lost)."""
    async with sm.begin() as s:
        return await reuse_db.waiting_on_ended(s)
