"""Recurring jobs: a user's own schedules (/api/ai/schedules) and the admins' view of everyone's
(/admin-api/ai/schedules). See docs/schedules.md.

Every change commits the row and its outbox event (`ai.schedule.sync` / `ai.schedule.trigger`)
together (jobs/schedules.py); the relay, woken by the commit's NOTIFY, makes Temporal follow.
A create, a resume and a trigger take one request from the owner's API rate, as a job's create
does (429 `RATE_LIMITED`); a pause and a delete are never refused, and an admin's pause or resume
takes from no one's rate.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response, status
from pydantic import AwareDatetime, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from api.cursors import CURSOR_PATTERN
from api.deps import Admin, ScheduleId, State, User
from api.limits import RATE_LIMITED_RESPONSE, RateLimitedUser
from api.schemas import (
    NO_NUL,
    Camel,
    Tags,
    UsdAmount,
    decode_cursor,
    encode_cursor,
    rfc3339_text,
    storable_input,
    storable_str,
)
from api.state import AppState
from engine.definition import CredentialMode
from engine.flow import TTL_S_MAX
from engine.schedules import Spec
from engine.scopes import JobScopes
from jobs.audit import AuditEntry, AuditLog
from jobs.schedules import NewSchedule, SchedulePolicy, ScheduleService, ScheduleView, next_run_at
from jobs.views import Owner

router = APIRouter(prefix="/api/ai/schedules", tags=["schedules"])
admin_router = APIRouter(prefix="/admin-api/ai/schedules", tags=["admin"])
Overlap = Literal["skip", "buffer_one", "allow_all"]
SCHEDULE_PAUSE = "schedule.pause"
SCHEDULE_RESUME = "schedule.resume"
SCHEDULE_LIST = "schedule.list"


class CreateScheduleBody(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    job_type: str = Field(min_length=1, max_length=64)
    input: dict[str, Any] = Field(default_factory=dict)
    # At least SCHEDULE_MIN_INTERVAL_S (checked by the service, 422 at `intervalSeconds`).
    interval_seconds: int | None = Field(default=None, ge=1, le=31_622_400, strict=True)
    cron: str | None = Field(default=None, min_length=1, max_length=128)
    timezone: str = Field(default="UTC", min_length=1, max_length=64)
    overlap: Overlap = "skip"
    start_at: AwareDatetime | None = None
    end_at: AwareDatetime | None = None
    paused: bool = Field(default=False, strict=True)
    # What the runs' jobs are about (as a job's create takes them); by default the schedule.
    target_type: str = Field(default="schedule", min_length=1, max_length=64)
    target_id: str | None = Field(default=None, min_length=1, max_length=128)
    # As a job's create takes them, for each run's job.
    priority: int | None = Field(default=None, ge=0, le=100, strict=True)
    credential_mode: CredentialMode | None = None
    max_cost_usd: Decimal | None = Field(
        default=None, gt=0, le=1_000_000, max_digits=18, decimal_places=8, allow_inf_nan=False
    )
    tags: Tags = Field(default_factory=list)
    # Each run's job's start-by TTL, counted from that run's create (a job's `concurrency` and
    # `deadline` are not taken: a recurring job has no one deadline, and its runs no key).
    ttl_seconds: int | None = Field(
        default=None,
        ge=0,
        le=TTL_S_MAX,
        strict=True,
        description="Each run's job must start within this many seconds of its create or it "
        "ends `JOB_EXPIRED` (0: no TTL; left out: the job type's, else AI_DEFAULT_TTL_S)",
    )

    @field_validator("job_type", "cron", "timezone", "target_type", "target_id")
    @classmethod
    def _storable_str(cls, v: str | None) -> str | None:
        return storable_str(v) if v is not None else None

    # RFC 3339 text, as a create's times are: a number would parse as a Unix time.
    _rfc3339 = field_validator("start_at", "end_at", mode="before")(rfc3339_text)

    @field_validator("input")
    @classmethod
    def _storable_input(cls, v: dict[str, Any]) -> dict[str, Any]:
        return storable_input(v)


class ScheduleRunOut(Camel):
    scheduled_at: datetime
    job_id: uuid.UUID | None = None
    error_code: str | None = None


class ScheduleResponse(Camel):
    schedule_id: uuid.UUID
    user_id: str
    job_type: str
    input: dict[str, Any]
    target_type: str
    target_id: str
    priority: int | None = None
    credential_mode: CredentialMode | None = None
    max_cost_usd: UsdAmount | None = None
    tags: list[str] = Field(default_factory=list)
    ttl_seconds: int | None = None
    interval_seconds: int | None = None
    cron: str | None = None
    timezone: str
    overlap: Overlap
    start_at: datetime | None = None
    end_at: datetime | None = None
    paused: bool
    next_run_at: datetime | None = None
    created_at: datetime
    updated_at: datetime
    recent_runs: list[ScheduleRunOut] = Field(default_factory=list)


class SchedulePage(Camel):
    items: list[ScheduleResponse]
    next_cursor: str | None = None


class TriggerResponse(Camel):
    schedule_id: uuid.UUID
    scheduled_at: datetime


def _service(state: AppState) -> ScheduleService:
    return ScheduleService(
        state.sessionmaker, state.jobs, SchedulePolicy.from_settings(state.settings)
    )


def _out(view: ScheduleView) -> ScheduleResponse:
    r = view.row
    return ScheduleResponse(
        schedule_id=r.id,
        user_id=r.user_id,
        job_type=r.job_type,
        input=r.input,
        target_type=r.target_type,
        target_id=r.target_id,
        priority=r.priority,
        credential_mode=r.credential_mode,
        max_cost_usd=r.max_cost_usd,
        tags=list(r.tags),
        ttl_seconds=r.ttl_s,
        interval_seconds=r.interval_s,
        cron=r.cron,
        timezone=r.timezone,
        overlap=r.overlap,
        start_at=r.start_at,
        end_at=r.end_at,
        paused=r.paused,
        next_run_at=view.next_run_at,
        created_at=r.created_at,
        updated_at=r.updated_at,
        recent_runs=[
            ScheduleRunOut(scheduled_at=x.scheduled_at, job_id=x.job_id, error_code=x.error_code)
            for x in view.recent_runs
        ],
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ScheduleResponse,
    responses=RATE_LIMITED_RESPONSE,
    summary="Create a recurring job",
    description=(
        "Runs a job of `jobType` with `input` every `intervalSeconds` or on a five-field `cron` "
        "in `timezone` (IANA, default UTC). `overlap` (default `skip`) says what a fire does "
        "while the previous run's job is still running. Quotas and budgets are checked at each "
        "run, not here; a refused run is listed in `recentRuns` with its code. The create, and "
        "each run, takes one request from your API rate (`RATE_LIMITED`)."
    ),
)
async def create_schedule(
    body: CreateScheduleBody, state: State, principal: RateLimitedUser, response: Response
) -> ScheduleResponse:
    row = await _service(state).create(
        NewSchedule(
            user_id=principal.user_id,
            job_type=body.job_type,
            input=body.input,
            spec=Spec(body.interval_seconds, body.cron, body.timezone, body.start_at, body.end_at),
            overlap=body.overlap,
            paused=body.paused,
            target_type=body.target_type,
            target_id=body.target_id,
            priority=body.priority,
            credential_mode=body.credential_mode,
            max_cost_usd=body.max_cost_usd,
            scopes=JobScopes(principal.org_id, principal.team_ids, tuple(body.tags)),
            ttl_s=body.ttl_seconds,
        )
    )
    response.headers["Location"] = f"/api/ai/schedules/{row.id}"
    return _out(ScheduleView(row, next_run_at(row), []))


async def _page(
    state: AppState, user_id: str | None, cursor: str | None, limit: int
) -> SchedulePage:
    rows = await _service(state).page(user_id, decode_cursor(cursor), limit)
    items = [_out(ScheduleView(r, next_run_at(r), [])) for r in rows]
    last = rows[-1] if len(rows) == limit else None
    return SchedulePage(
        items=items, next_cursor=encode_cursor((last.created_at, last.id)) if last else None
    )


@router.get("", response_model=SchedulePage, summary="List your schedules, newest first")
async def list_schedules(
    state: State,
    principal: User,
    cursor: Annotated[str | None, Query(max_length=200, pattern=CURSOR_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> SchedulePage:
    return await _page(state, principal.user_id, cursor, limit)


@router.get("/{scheduleId}", response_model=ScheduleResponse, summary="Get one of your schedules")
async def get_schedule(schedule_id: ScheduleId, state: State, principal: User) -> ScheduleResponse:
    # As for a job: the owner and admins see it, anyone else gets 404.
    return _out(await _service(state).get(schedule_id, principal))


async def _set_paused(
    state: AppState, schedule_id: uuid.UUID, viewer: Owner, paused: bool
) -> ScheduleResponse:
    svc = _service(state)
    await svc.set_paused(schedule_id, viewer, paused)
    return _out(await svc.get(schedule_id, viewer))


@router.post("/{scheduleId}/pause", response_model=ScheduleResponse, summary="Pause")
async def pause_schedule(
    schedule_id: ScheduleId, state: State, principal: User
) -> ScheduleResponse:
    return await _set_paused(state, schedule_id, Owner(principal.user_id), True)


@router.post(
    "/{scheduleId}/resume",
    response_model=ScheduleResponse,
    responses=RATE_LIMITED_RESPONSE,
    summary="Resume (takes one request from your API rate)",
)
async def resume_schedule(
    schedule_id: ScheduleId, state: State, principal: RateLimitedUser
) -> ScheduleResponse:
    return await _set_paused(state, schedule_id, Owner(principal.user_id), False)


@router.post(
    "/{scheduleId}/trigger",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TriggerResponse,
    responses=RATE_LIMITED_RESPONSE,
    summary="Run once now (even while paused)",
    description=(
        "Starts one run now, even while paused. The trigger takes one request from your API "
        "rate, and its run another, as every run's create does (a refused run is recorded "
        "`RATE_LIMITED` in `recentRuns`)."
    ),
)
async def trigger_schedule(
    schedule_id: ScheduleId, state: State, principal: RateLimitedUser
) -> TriggerResponse:
    at = await _service(state).trigger(schedule_id, Owner(principal.user_id))
    return TriggerResponse(schedule_id=schedule_id, scheduled_at=at)


@router.delete("/{scheduleId}", status_code=status.HTTP_204_NO_CONTENT, summary="Delete a schedule")
async def delete_schedule(schedule_id: ScheduleId, state: State, principal: User) -> Response:
    await _service(state).delete(schedule_id, Owner(principal.user_id))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# ---- admins ---------------------------------------------------------------------------------


@admin_router.get("", response_model=SchedulePage, summary="List all schedules, newest first")
async def admin_list_schedules(
    state: State,
    admin: Admin,
    user_id: Annotated[str | None, Query(alias="userId", max_length=128, pattern=NO_NUL)] = None,
    cursor: Annotated[str | None, Query(max_length=200, pattern=CURSOR_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> SchedulePage:
    page = await _page(state, user_id, cursor, limit)
    await AuditLog(state.sessionmaker).record(
        AuditEntry(admin.user_id, SCHEDULE_LIST, "schedule", None), "ok", count=len(page.items)
    )
    return page


async def _admin_set_paused(
    state: AppState, schedule_id: uuid.UUID, actor: str, paused: bool
) -> ScheduleResponse:
    action = SCHEDULE_PAUSE if paused else SCHEDULE_RESUME
    audit = AuditLog(state.sessionmaker)
    entry = AuditEntry(actor, action, "schedule", str(schedule_id))
    async with audit.refusals(entry):
        out = await _set_paused(state, schedule_id, Owner(actor, is_admin=True), paused)
    await audit.record(entry, "ok")
    return out


@admin_router.post("/{scheduleId}/pause", response_model=ScheduleResponse, summary="Pause any")
async def admin_pause_schedule(
    schedule_id: ScheduleId, state: State, admin: Admin
) -> ScheduleResponse:
    return await _admin_set_paused(state, schedule_id, admin.user_id, True)


@admin_router.post("/{scheduleId}/resume", response_model=ScheduleResponse, summary="Resume any")
async def admin_resume_schedule(
    schedule_id: ScheduleId, state: State, admin: Admin
) -> ScheduleResponse:
    return await _admin_set_paused(state, schedule_id, admin.user_id, False)
