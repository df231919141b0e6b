"""Flow control's use cases (docs/api.md "Flow control"): keyed concurrency at create, the
start-by TTL and the whole-job deadline. Operator pauses are jobs/pauses.py.

- `plan` (no I/O, part of a create's checks, jobs/requests.py): a create's `concurrency`,
  `ttlSeconds` and `deadline` checked against each other, its job type and `runAt` (a setting
  that guarantees expiry, or that the engine cannot honour, is a 422 located at the field), and
  what they make of the job.
- `decide` (in the create's transaction, under the user's create lock, after an
  `Idempotency-Key` replay was decided): from ONE read of the user's active jobs with the key,
  `skip` answers with the job holding it; `supersede` ends the older queued jobs `SUPERSEDED`
  (and names the running ones, cancelled after the commit by `supersede_running`, as the cancel
  API cancels a job); `debounce` ends the queued debounced ones and gives the new job its due
  time (its own delay, not past its chain's first create plus that create's `maxDelayMs`), the
  time its enqueue row becomes available to the relay: it waits in the outbox, outside its
  user's dispatch window. Creates on every API process take the same lock, so they see each
  other.
- `expire` (the job workflow's `flow_expire` stage) and `expire_undispatched` (the relay): a
  job whose start-by time passed before it was admitted ends `JOB_EXPIRED`; one whose deadline
  passed ends `JOB_DEADLINE_EXCEEDED` wherever it is (queued: now; running: its cancel is
  requested, and its workflow stops it as a cancel does).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncSession

from db import flow as flow_db
from db import jobs as jobs_db
from db.flow import KeyHolder
from db.jobs import JobRow
from db.session import SessionMaker
from engine import flow
from engine.errors import IllegalTransition, ValidationFailed
from engine.flow import DEBOUNCE, JOB_DEADLINE_EXCEEDED, JOB_EXPIRED, SKIP, SUPERSEDE, Concurrency
from engine.lifecycle import LifecycleStatus
from jobs import lifecycle

if TYPE_CHECKING:
    from jobs.requests import CreateJobRequest
    from jobs.spec import AnyJobType, Catalog

log = logging.getLogger(__name__)

QUEUED = LifecycleStatus.QUEUED.value
RUNNING = LifecycleStatus.RUNNING.value
WorkflowCanceller = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class FlowPlan:
    """What a create's flow members make of the job: its `concurrency` (as given), its
    effective TTL in seconds (the create's, its type's or AI_DEFAULT_TTL_S; None: none) and its
    deadline."""

    concurrency: Concurrency | None = None
    ttl_s: int | None = None
    deadline: datetime | None = None

    def start_by(self, now: datetime, run_at: datetime | None) -> datetime | None:
        return flow.start_by(now, run_at, self.ttl_s)


def _refuse(message: str, *loc: str) -> ValidationFailed:
    return ValidationFailed(
        message, errors=[{"loc": ["body", *loc], "msg": message, "type": "value_error"}]
    )


def plan(
    req: CreateJobRequest, jt: AnyJobType, default_ttl_s: int, now: datetime | None = None
) -> FlowPlan:
    """The create's flow members checked (pure): what the API's schema cannot say, each 422
    located at its field. A debounce needs its `delayMs`; `maxDelayMs` is not below it; a TTL
    shorter than the debounce delay, a deadline before `runAt` (plus the delay) or on a job
    type whose jobs cannot be cancelled could never be honoured, so they are refused."""
    now = now or datetime.now(UTC)
    c = req.concurrency
    delay_ms = 0
    if c is not None and c.mode == DEBOUNCE:
        if c.delay_ms is None:
            raise _refuse("delayMs is required with mode debounce", "concurrency", "delayMs")
        delay_ms = c.delay_ms
        if c.max_delay_ms is not None and c.max_delay_ms < c.delay_ms:
            raise _refuse("maxDelayMs must not be below delayMs", "concurrency", "maxDelayMs")
    elif c is not None and (c.delay_ms is not None or c.max_delay_ms is not None):
        raise _refuse("delayMs and maxDelayMs go with mode debounce only", "concurrency")
    ttl_s = flow.effective_ttl(req.ttl_seconds, jt.definition.ttl_seconds, default_ttl_s)
    if ttl_s is not None and ttl_s * 1000 < delay_ms:
        where = ("ttlSeconds",) if req.ttl_seconds is not None else ("concurrency", "delayMs")
        raise _refuse(
            f"a TTL of {ttl_s} s is shorter than the debounce delay: the job would always "
            "expire before it could start",
            *where,
        )
    if req.deadline is not None:
        base = req.run_at if req.run_at is not None and req.run_at > now else now
        if req.deadline <= base + timedelta(milliseconds=delay_ms):
            raise _refuse(
                "deadline must come after runAt (and the debounce delay): the job would always "
                "pass it before it could start",
                "deadline",
            )
        if not jt.definition.execution.cancellable:
            raise _refuse("this job type's jobs cannot be stopped: no deadline", "deadline")
    return FlowPlan(c, ttl_s, req.deadline)


def fingerprint(req: CreateJobRequest) -> dict[str, str]:
    """The flow members as the create gave them, for the request an `Idempotency-Key` stands
    for (empty when none was given: earlier fingerprints are unchanged)."""
    out: dict[str, str] = {}
    if req.concurrency is not None:
        out["concurrency"] = req.concurrency.fingerprint()
    if req.ttl_seconds is not None:
        out["ttlSeconds"] = str(req.ttl_seconds)
    if req.deadline is not None:
        out["deadline"] = req.deadline.astimezone(UTC).isoformat()
    return out


@dataclass
class Decision:
    """What `decide` found: the job holding the key (`skip`: nothing is created), the new job's
    due time and debounce chain's latest start, the queued jobs it ended and the running ones
    to cancel after the commit."""

    holder: JobRow | None = None
    due_at: datetime | None = None
    debounce_until: datetime | None = None
    replaced: list[KeyHolder] = field(default_factory=list)
    running: list[KeyHolder] = field(default_factory=list)

    @property
    def cancel_workflows(self) -> list[str]:
        """The workflows of the replaced jobs the relay had dispatched (cancelled after the
        commit: a run waiting on a timer stops at once)."""
        return [h.workflow_id for h in self.replaced if h.dispatched]


async def decide(
    s: AsyncSession,
    req: CreateJobRequest,
    c: Concurrency,
    new_id: uuid.UUID,
    *,
    default_max_delay_ms: int,
    now: datetime | None = None,
) -> Decision:
    """The concurrency decision, in the create's transaction under the user's lock (module
    text). Queued jobs end in this transaction, with no call and their reservation released
    (a reservation is held by an active job only)."""
    now = now or datetime.now(UTC)
    holders = await flow_db.active_with_key(s, req.user_id, c.key)
    if c.mode == SKIP:
        if not holders:
            return Decision()
        return Decision(holder=await jobs_db.get(s, holders[0].id))
    out = Decision()
    if c.mode == SUPERSEDE:
        targets = holders
    else:
        targets = [h for h in holders if h.lifecycle_status == QUEUED and h.mode == DEBOUNCE]
        caps = [h.debounce_until for h in targets if h.debounce_until is not None]
        own = flow.debounce_cap(now, c.max_delay_ms or default_max_delay_ms)
        out.debounce_until = min(caps, default=own)
        assert c.delay_ms is not None  # plan() refused a debounce without it
        out.due_at = flow.debounce_due(now, req.run_at, c.delay_ms, out.debounce_until)
    for h in targets:
        if h.lifecycle_status == QUEUED:
            try:
                await lifecycle.cancel(
                    s, h.id, only_if_queued=True, code=flow.SUPERSEDED, superseded_by=new_id
                )
            except IllegalTransition:  # admitted since the read: a running one now
                h = dataclasses.replace(h, lifecycle_status=RUNNING)
            else:
                out.replaced.append(h)
                continue
        if c.mode == SUPERSEDE:  # debounce leaves a running job alone
            out.running.append(h)
    return out


async def supersede_running(
    sm: SessionMaker,
    catalog: Catalog,
    holders: list[KeyHolder],
    new_id: uuid.UUID,
    cancel_workflow: WorkflowCanceller | None,
) -> list[KeyHolder]:
    """After the create's commit: each running job `supersede` replaced is cancelled as the
    cancel API cancels it (its cancel requested, with `SUPERSEDED` and the new job's id, then
    its workflow cancelled: the call in flight is aborted and charged, and no later call is
    sent). A job type that cannot be cancelled is left running. Returns the jobs asked to
    stop."""
    done: list[KeyHolder] = []
    for h in holders:
        if h.job_type in catalog and not catalog.get(h.job_type).definition.execution.cancellable:
            continue
        async with sm.begin() as s:
            row = await jobs_db.get_for_update(s, h.id)
            if row is None or row.lifecycle_status not in (QUEUED, RUNNING):
                continue  # it ended meanwhile
            await lifecycle.request_cancel(
                s,
                h.id,
                LifecycleStatus(row.lifecycle_status),
                code=flow.SUPERSEDED,
                superseded_by=new_id,
            )
        done.append(h)
        await cancel_workflows(cancel_workflow, [h.workflow_id])
    return done


async def after_create(
    sm: SessionMaker,
    catalog: Catalog,
    decided: Decision,
    new_id: uuid.UUID,
    cancel_workflow: WorkflowCanceller | None,
) -> None:
    """After a create's commit: the replaced jobs' workflows cancelled, and the running ones a
    `supersede` replaced cancelled as the cancel API cancels them (`decided.running` keeps those
    asked to stop)."""
    await cancel_workflows(cancel_workflow, decided.cancel_workflows)
    if decided.running:
        stopped = await supersede_running(sm, catalog, decided.running, new_id, cancel_workflow)
        decided.running[:] = stopped


async def cancel_workflows(cancel_workflow: WorkflowCanceller | None, ids: list[str]) -> None:
    """Best effort, after a commit: a workflow that fails to cancel finds its job ended (or
    its cancel requested, which EXECUTE's heartbeat reads) at its next stage."""
    if cancel_workflow is None:
        return
    for wf in ids:
        try:
            await cancel_workflow(wf)
        except Exception:
            log.info("workflow of a superseded job not cancelled", extra={"workflow_id": wf})


@dataclass(frozen=True)
class Expired:
    """How `expire` left a job: `acted` (this call cancelled it, or requested its cancel: a
    running job at its deadline), its state after, and its type. A job left `running` without
    `acted` was admitted before its start-by time: the TTL no longer applies."""

    acted: bool
    status: str
    job_type: str = ""

    @property
    def ended(self) -> bool:
        """The run stops waiting: the job ended (or is being stopped)."""
        return self.acted or self.status != RUNNING


async def expire(sm: SessionMaker, job_id: uuid.UUID, code: str) -> Expired:
    """A job's start-by time (`JOB_EXPIRED`) or deadline (`JOB_DEADLINE_EXCEEDED`) came while it
    waited: queued, it ends `cancelled` with the code now (no call, no `startedAt`, its
    reservation released, `ai.job.cancelled` sent); running, a TTL no longer applies, and a
    deadline has its cancel requested (its workflow stops it as a cancel does)."""
    async with sm.begin() as s:
        row = await jobs_db.get_for_update(s, job_id)
        if row is None:
            return Expired(False, LifecycleStatus.CANCELLED.value)
        status = row.lifecycle_status
        if status == QUEUED:
            await lifecycle.cancel(s, job_id, only_if_queued=True, code=code)
            return Expired(True, LifecycleStatus.CANCELLED.value, row.job_type)
        if status == RUNNING and code == JOB_DEADLINE_EXCEEDED:
            await lifecycle.request_cancel(s, job_id, LifecycleStatus.RUNNING, code=code)
            return Expired(row.cancel_requested_at is None, status, row.job_type)
        return Expired(False, status, row.job_type)


async def expire_undispatched(sm: SessionMaker, limit: int) -> list[tuple[str, str]]:
    """The relay's expiry: up to `limit` queued jobs it has not dispatched whose start-by time
    or deadline passed end `cancelled` with their code, and their enqueue rows are closed, in
    one transaction. Returns (job type, code) of each."""
    async with sm.begin() as s:
        due = await flow_db.due_expiries(s, limit)
        ended = []
        for e in due:
            code = JOB_DEADLINE_EXCEEDED if e.deadline else JOB_EXPIRED
            await lifecycle.cancel(s, e.id, only_if_queued=True, code=code)
            ended.append((e.job_type, code))
    return ended


def expiry_at_start(row: JobRow, *, admitted_before: bool, now: datetime) -> str | None:
    """EXECUTE's check in its first transaction: the code the job ends with instead of a call
    (its deadline passed; or its start-by time, unless it was admitted before), None: go on."""
    if row.deadline_at is not None and row.deadline_at <= now:
        return JOB_DEADLINE_EXCEEDED
    if not admitted_before and row.expires_at is not None and row.expires_at <= now:
        return JOB_EXPIRED
    return None
