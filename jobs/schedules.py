"""Recurring jobs: the use cases behind /api/ai/schedules, and one run of a schedule.

The schedule row in PostgreSQL is the source of truth for its owner, input and spec; every
change to it writes an outbox event (`ai.schedule.sync` or `ai.schedule.trigger`,
`db/schedules.py`) in the same transaction, and the relay makes Temporal match
(`jobs/schedule_dispatch.py`), so a schedule and its Temporal schedule are created and removed
together. A run takes one request from its owner's API rate, then creates its job through
`JobService.create`, the API's own create path (quotas, budgets), with the key (schedule,
scheduled time): a duplicated fire makes one job. A refused run is recorded with its code and an
`ai.schedule.run_refused` event, never dropped.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from db import jobs as jobs_db
from db import schedules as schedules_db
from db.schedules import RunRow, ScheduleRow
from db.session import SessionMaker
from db.webhook_deliveries import DeliveryRow
from engine.errors import EngineError, ValidationFailed
from engine.lifecycle import TERMINAL_VALUES
from engine.schedules import (
    OVERLAPS,
    RUN_REFUSED,
    InvalidSpec,
    ScheduledRunResult,
    Spec,
    check_spec,
    idempotency_key,
    iso,
    next_fire,
)
from engine.scopes import JobScopes
from engine.settings import Settings
from jobs.rate_limit import take_request
from jobs.service import CreateJobRequest, JobService
from jobs.token_count import off_loop
from jobs.tracecontext import current_trace_context
from jobs.views import Viewer, can_see

log = logging.getLogger(__name__)
RECENT_RUNS = 20
# Schedules per user: each fires jobs on its own, so the cap bounds what one user's schedules
# ask of the engine (the jobs themselves also count against the user's quotas).
MAX_PER_USER = 20


async def schedule_event_body(session: AsyncSession, row: DeliveryRow) -> dict[str, Any] | None:
    """A schedule event's webhook body, `{type, timestamp, data}` as a job event's, with `data`
    the event's payload (`scheduleId`, `scheduledAt`, `errorCode`); None for any other event."""
    if row.event_type != RUN_REFUSED:
        return None
    data = await schedules_db.event_payload(session, row.event_id, row.event_type)
    if data is None or data.get("scheduleId") != row.job_id:
        return None
    return {"type": row.event_type, "timestamp": iso(row.occurred_at), "data": data}


class ScheduleNotFound(EngineError):
    code = "SCHEDULE_NOT_FOUND"
    http_status = 404
    title = "Schedule not found"


class ScheduleLimitReached(EngineError):
    """A user holds MAX_PER_USER schedules: each fires jobs on its own, so the cap bounds what
    one user's schedules ask of the engine."""

    code = "SCHEDULE_LIMIT_REACHED"
    http_status = 409
    title = "Schedule limit reached"


@dataclass(frozen=True)
class NewSchedule:
    user_id: str
    job_type: str
    input: dict[str, Any]
    spec: Spec
    overlap: str = "skip"
    paused: bool = False
    target_type: str = "schedule"
    target_id: str | None = None
    priority: int | None = None
    credential_mode: str | None = None
    max_cost_usd: Decimal | None = None
    # The creating token's organisation and teams, and the template's tags.
    scopes: JobScopes = field(default_factory=JobScopes)
    ttl_s: int | None = None  # each run's job's start-by TTL (None: the defaults; 0: none)


@dataclass(frozen=True)
class ScheduleView:
    row: ScheduleRow
    next_run_at: datetime | None
    recent_runs: list[RunRow]


@dataclass(frozen=True)
class SchedulePolicy:
    min_interval_s: int
    max_per_user: int = MAX_PER_USER
    # The owner's API rate (API_RATE_LIMIT_PER_MINUTE, _BURST): each run takes one request.
    rate_per_minute: int = 0
    rate_burst: int = 1

    @classmethod
    def from_settings(cls, settings: Settings) -> SchedulePolicy:
        # MAX_PER_USER read when called: a test may patch it.
        return cls(
            settings.schedule_min_interval_s,
            MAX_PER_USER,
            settings.api_rate_limit_per_minute,
            settings.api_rate_limit_burst,
        )


def spec_of(row: ScheduleRow) -> Spec:
    return Spec(row.interval_s, row.cron, row.timezone, row.start_at, row.end_at)


def next_run_at(row: ScheduleRow, now: datetime | None = None) -> datetime | None:
    """None while paused or past `endAt`; otherwise the next fire of the spec."""
    if row.paused:
        return None
    return next_fire(spec_of(row), now or datetime.now(UTC))


class ScheduleService:
    def __init__(self, sessionmaker: SessionMaker, jobs: JobService, policy: SchedulePolicy):
        self._sm = sessionmaker
        self._jobs = jobs
        self._policy = policy

    async def create(self, new: NewSchedule) -> ScheduleRow:
        """Checks the spec and the job (type, input) as a create would, but no quota: creating
        a schedule is not refused by job quotas, its runs are."""
        if new.overlap not in OVERLAPS:
            raise ValidationFailed(f"overlap must be one of {', '.join(OVERLAPS)}.")
        try:
            spec = check_spec(new.spec, min_interval_s=self._policy.min_interval_s)
        except InvalidSpec as exc:
            loc = ["body", exc.field] if exc.field else ["body"]
            errors: list[dict[str, object]] = [{"loc": loc, "msg": str(exc), "type": "value"}]
            raise ValidationFailed(str(exc), errors=errors) from exc
        schedule_id = uuid.uuid4()
        target_id = new.target_id or str(schedule_id)
        req = self._request(new, target_id, new.input, None)
        checked = await off_loop(self._jobs.creation.requests.check, req)
        now = datetime.now(UTC)
        row = ScheduleRow(
            id=schedule_id,
            user_id=new.user_id,
            job_type=checked.job_type.job_type,
            target_type=new.target_type,
            target_id=target_id,
            input=new.input,
            priority=new.priority,
            credential_mode=new.credential_mode,
            max_cost_usd=new.max_cost_usd,
            interval_s=spec.interval_s,
            cron=spec.cron,
            timezone=spec.timezone,
            overlap=new.overlap,
            start_at=spec.start_at,
            end_at=spec.end_at,
            paused=new.paused,
            created_at=now,
            updated_at=now,
            org_id=new.scopes.org_id,
            team_ids=list(new.scopes.team_ids),
            tags=list(new.scopes.tags),
            ttl_s=new.ttl_s,
        )
        async with self._sm.begin() as s:
            await schedules_db.lock_user(s, new.user_id)
            if await schedules_db.count_for_user(s, new.user_id) >= self._policy.max_per_user:
                raise ScheduleLimitReached(
                    f"At most {self._policy.max_per_user} schedules per user; delete one first."
                )
            await schedules_db.insert(s, row)
            await schedules_db.add_sync(s, schedule_id, trace_context=current_trace_context())
        return row

    @staticmethod
    def _request(
        row: NewSchedule | ScheduleRow, target_id: str, raw: dict[str, Any], key: str | None
    ) -> CreateJobRequest:
        return CreateJobRequest(
            user_id=row.user_id,
            job_type=row.job_type,
            target_type=row.target_type,
            target_id=target_id,
            input=raw,
            priority=row.priority,
            idempotency_key=key,
            credential_mode=row.credential_mode,
            max_cost_usd=row.max_cost_usd,
            scopes=row.scopes
            if isinstance(row, NewSchedule)
            else JobScopes(row.org_id, tuple(row.team_ids), tuple(row.tags)),
            ttl_seconds=row.ttl_s,  # counted from each run's create
        )

    async def get(self, schedule_id: uuid.UUID, viewer: Viewer) -> ScheduleView:
        async with self._sm() as s:
            row = await schedules_db.get(s, schedule_id)
            if row is None or not can_see(viewer, row.user_id):
                raise ScheduleNotFound("Schedule not found.")
            runs = await schedules_db.recent_runs(s, schedule_id, RECENT_RUNS)
        return ScheduleView(row, next_run_at(row), runs)

    async def page(
        self, user_id: str | None, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[ScheduleRow]:
        async with self._sm() as s:
            return await schedules_db.page(s, user_id=user_id, after=after, limit=limit)

    async def _owned(self, s: Any, schedule_id: uuid.UUID, viewer: Viewer) -> ScheduleRow:
        row = await schedules_db.get(s, schedule_id, for_update=True)
        if row is None or not can_see(viewer, row.user_id):
            raise ScheduleNotFound("Schedule not found.")
        return row

    async def set_paused(self, schedule_id: uuid.UUID, viewer: Viewer, paused: bool) -> None:
        """The row changes at once (a run reads it before it creates anything: after this has
        answered, only a run already past that read may still land); Temporal follows."""
        async with self._sm.begin() as s:
            await self._owned(s, schedule_id, viewer)
            await schedules_db.set_paused(s, schedule_id, paused)
            await schedules_db.add_sync(s, schedule_id, trace_context=current_trace_context())

    async def trigger(self, schedule_id: uuid.UUID, viewer: Viewer) -> datetime:
        """One run now, paused or not: its time is the run's scheduled time (and key)."""
        at = datetime.now(UTC)
        async with self._sm.begin() as s:
            await self._owned(s, schedule_id, viewer)
            await schedules_db.add_trigger(
                s, schedule_id, at, trace_context=current_trace_context()
            )
        return at

    async def delete(self, schedule_id: uuid.UUID, viewer: Viewer) -> None:
        async with self._sm.begin() as s:
            await self._owned(s, schedule_id, viewer)
            await schedules_db.delete(s, schedule_id)
            await schedules_db.add_sync(s, schedule_id, trace_context=current_trace_context())

    # ---- one run --------------------------------------------------------------------------

    async def run(
        self, schedule_id: uuid.UUID, scheduled_at: datetime, *, manual: bool
    ) -> ScheduledRunResult:
        """Creates the run's job (or records why not). A fire of a paused or deleted schedule
        creates nothing; a manual run goes ahead while paused. The run takes one request from
        its owner's API rate first, as a create does (`RATE_LIMITED`: no job); a retried run
        whose job or outcome exists already takes nothing."""
        sid, at = str(schedule_id), iso(scheduled_at)
        key = idempotency_key(sid, scheduled_at)
        async with self._sm() as s:
            row = await schedules_db.get(s, schedule_id)
            done = await schedules_db.get_run(s, schedule_id, scheduled_at)
            made = row is not None and await jobs_db.find_by_idempotency_key(
                s, row.user_id, row.job_type, key
            )
        if row is None or (row.paused and not manual):
            return ScheduledRunResult(sid, at, "skipped")
        if done is not None:  # a retry after the run was recorded: its outcome, again
            if done.job_id is None:
                return ScheduledRunResult(sid, at, "refused", error_code=done.error_code)
            return ScheduledRunResult(sid, at, "created", job_id=str(done.job_id))
        job_id: uuid.UUID | None = None
        code: str | None = None
        try:
            if not made:
                await self._take_request(row.user_id)
            job_id = (
                await self._jobs.create(self._request(row, row.target_id, row.input, key))
            ).job.id
        except EngineError as exc:
            code = exc.code
        await self._record(row, scheduled_at, job_id, code, manual=manual)
        if code is not None:
            log.info("schedule run refused", extra={"schedule_id": sid, "error_code": code})
            return ScheduledRunResult(sid, at, "refused", error_code=code)
        return ScheduledRunResult(sid, at, "created", job_id=str(job_id))

    async def _take_request(self, user_id: str) -> None:
        p = self._policy
        await take_request(self._sm, user_id, per_minute=p.rate_per_minute, burst=p.rate_burst)

    async def _record(
        self,
        row: ScheduleRow,
        scheduled_at: datetime,
        job_id: uuid.UUID | None,
        code: str | None,
        *,
        manual: bool,
    ) -> None:
        """The run's row and, for a refused run recorded now, its event and deliveries."""
        sid, at = str(row.id), iso(scheduled_at)
        async with self._sm.begin() as s:
            fresh = await schedules_db.record_run(
                s, row.id, scheduled_at, job_id=job_id, error_code=code, manual=manual
            )
            if fresh and code is not None:
                await schedules_db.insert_refused_event(
                    s,
                    event_type=RUN_REFUSED,
                    user_id=row.user_id,
                    schedule_id=sid,
                    dedupe_key=f"{RUN_REFUSED}:{sid}:{at}",
                    payload={"scheduleId": sid, "scheduledAt": at, "errorCode": code},
                )

    async def job_ended(self, job_id: uuid.UUID) -> bool:
        """Whether a run's job has ended (a job gone counts as ended)."""
        async with self._sm() as s:
            job = await jobs_db.get(s, job_id)
        return job is None or job.lifecycle_status in TERMINAL_VALUES
