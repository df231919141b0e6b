"""What AI calls cost, as users and admins read it.

- `GET /api/ai/usage`: the caller's own spend over UTC days, grouped by day, job type or model.
- `GET /admin-api/ai/usage`: anyone's (SUPER_ADMIN), also grouped by user or credential mode,
  with optional filters.
- `GET /api/ai/jobs/{jobId}/usage`: one job's calls per attempt, for its owner or an admin;
  anyone else's job is the same 404 `JOB_NOT_FOUND` as a missing one (jobs/views.py).

The ranges are read from the daily rollup (`ai_usage_daily`), kept in the transaction of every
usage row, so a range costs what its (day, user, job type, model, mode) buckets cost, however
many calls they hold. A job's usage is read from the log by its `job_id` index. Days are UTC
calendar days, inclusive at both ends; a range is at most `MAX_RANGE_DAYS` long.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BeforeValidator

from api.deps import Admin, JobId, State, User
from api.schemas import JOB_TYPE_PATTERN, NO_NUL
from api.usage_schemas import (
    AdminUsageGroupBy,
    AttemptUsageOut,
    JobUsageResponse,
    ProviderCallOut,
    UsageGroupBy,
    UsageItem,
    UsageReport,
    UsageSums,
)
from db import usage_scopes as usage_scopes_db
from db.usage import Grouping, UsageBucket, UsageFilter, grouped_usage, job_attempts, job_money
from db.usage_scopes import SCOPE_GROUPINGS, ScopeFilter
from engine.definition import CredentialMode
from engine.errors import ValidationFailed
from engine.scopes import SCOPE_ID_PATTERN
from jobs.views import can_see, not_found

router = APIRouter(tags=["usage"])

MAX_RANGE_DAYS = 366
DEFAULT_RANGE_DAYS = 30
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def iso_date(value: Any) -> Any:
    """`YYYY-MM-DD` only: not a number (which pydantic would read as a Unix time)."""
    if isinstance(value, str) and not _DATE.match(value):
        raise ValueError("must be a date YYYY-MM-DD")
    return value


IsoDate = Annotated[date, BeforeValidator(iso_date)]
FromQuery = Annotated[
    IsoDate | None,
    Query(
        alias="from",
        description="First UTC day, inclusive (default: `to` minus 29 days)",
        examples=["2026-01-01"],
    ),
]
ToQuery = Annotated[
    IsoDate | None,
    Query(description="Last UTC day, inclusive (default: today, UTC)", examples=["2026-01-30"]),
]


def _range(start: date | None, end: date | None) -> tuple[date, date]:
    """The inclusive UTC day range a request asks for, or 422 naming the field at fault."""
    end = end or datetime.now(UTC).date()
    start = start or end - timedelta(days=DEFAULT_RANGE_DAYS - 1)
    if start > end:
        raise ValidationFailed(
            "`from` must not be after `to`.",
            errors=[{"loc": ["query", "from"], "msg": "after `to`", "type": "value_error"}],
        )
    if (end - start).days + 1 > MAX_RANGE_DAYS:
        raise ValidationFailed(
            f"A usage range spans at most {MAX_RANGE_DAYS} days.",
            errors=[
                {
                    "loc": ["query", "from"],
                    "msg": f"more than {MAX_RANGE_DAYS} days before `to`",
                    "type": "value_error",
                }
            ],
        )
    return start, end


def _sums(buckets: list[UsageBucket]) -> UsageSums:
    return UsageSums(
        calls=sum(b.calls for b in buckets),
        tokens_in=sum(b.tokens_in for b in buckets),
        tokens_out=sum(b.tokens_out for b in buckets),
        cost_usd=sum((b.cost_usd for b in buckets), Decimal(0)),
        estimated_cost_usd=sum((b.estimated_cost_usd for b in buckets), Decimal(0)),
    )


def _report(
    start: date,
    end: date,
    group_by: str,
    buckets: list[UsageBucket],
    total: UsageBucket | None = None,
) -> UsageReport:
    """The report of `buckets`; its total is `total` when given (a grouping in which a call may
    count in several items, or in none), else the sum of the items."""
    items = [
        UsageItem(
            key=b.key,
            calls=b.calls,
            tokens_in=b.tokens_in,
            tokens_out=b.tokens_out,
            cost_usd=b.cost_usd,
            estimated_cost_usd=b.estimated_cost_usd,
        )
        for b in buckets
    ]
    sums = _sums(buckets if total is None else [total])
    return UsageReport(from_=start, to=end, group_by=group_by, items=items, total=sums)


@router.get(
    "/api/ai/usage",
    response_model=UsageReport,
    summary="Your AI spend over UTC days",
    description=(
        "Your provider calls (failed ones included), tokens and cost over the UTC days "
        "`from`..`to` (inclusive; `to` defaults to today, `from` to `to` minus 29 days; at most "
        f"{MAX_RANGE_DAYS} days), grouped by `day`, `jobType` or `model`. `costUsd` is a "
        "decimal string with 8 places; `estimatedCostUsd` is its part charged on the engine's "
        "estimate (calls whose answer was not read to its end). `from` after `to`, or a "
        "longer range, is 422 `VALIDATION_FAILED` naming `from`."
    ),
)
async def own_usage(
    state: State,
    principal: User,
    from_: FromQuery = None,
    to: ToQuery = None,
    group_by: Annotated[UsageGroupBy, Query(alias="groupBy")] = "day",
) -> UsageReport:
    start, end = _range(from_, to)
    f = UsageFilter(start=start, end=end, user_id=principal.user_id)
    async with state.sessionmaker() as s:
        buckets = await grouped_usage(s, f, group_by)
    return _report(start, end, group_by, buckets)


@router.get(
    "/admin-api/ai/usage",
    response_model=UsageReport,
    tags=["admin"],
    summary="Any user's AI spend over UTC days",
    description=(
        "As `GET /api/ai/usage`, for every user (SUPER_ADMIN): grouped by `user`, `jobType`, "
        "`model`, `day`, `credentialMode`, `org`, `team` or `tag`, optionally only one "
        "`userId`, `jobType`, `model`, `credentialMode`, `orgId`, `teamId` or `tag`. By "
        "`org`, `team` or `tag`, a job counts in its organisation's item and in the item of "
        "each of its teams and tags (a job of two teams in both), and in no item of a "
        "grouping it has none of: `total` counts every call matching the filters once, jobs "
        "in no item included, so it is not the sum of the items."
    ),
)
async def admin_usage(
    state: State,
    _admin: Admin,
    from_: FromQuery = None,
    to: ToQuery = None,
    group_by: Annotated[AdminUsageGroupBy, Query(alias="groupBy")] = "day",
    user_id: Annotated[str | None, Query(alias="userId", max_length=128, pattern=NO_NUL)] = None,
    job_type: Annotated[
        str | None, Query(alias="jobType", max_length=64, pattern=JOB_TYPE_PATTERN)
    ] = None,
    model: Annotated[str | None, Query(max_length=128, pattern=NO_NUL)] = None,
    credential_mode: Annotated[CredentialMode | None, Query(alias="credentialMode")] = None,
    org_id: Annotated[str | None, Query(alias="orgId", pattern=SCOPE_ID_PATTERN)] = None,
    team_id: Annotated[str | None, Query(alias="teamId", pattern=SCOPE_ID_PATTERN)] = None,
    tag: Annotated[str | None, Query(pattern=SCOPE_ID_PATTERN)] = None,
) -> UsageReport:
    start, end = _range(from_, to)
    f = UsageFilter(
        start=start,
        end=end,
        user_id=user_id,
        job_type=job_type,
        model=model,
        credential_mode=credential_mode,
    )
    scopes = ScopeFilter(org_id, team_id, tag)
    async with state.sessionmaker() as s:
        if not scopes and group_by not in SCOPE_GROUPINGS:
            grouping: Grouping = group_by  # type: ignore[assignment]  # not a scope grouping
            return _report(start, end, group_by, await grouped_usage(s, f, grouping))
        buckets = await usage_scopes_db.grouped(s, f, scopes, group_by)
        if scopes:  # only scoped jobs match: each of their rollup rows once
            total = await usage_scopes_db.total(s, f, scopes)
        else:  # every job matches, those in no item too
            total = _as_total(await grouped_usage(s, f, "day"))
    return _report(start, end, group_by, buckets, total)


def _as_total(buckets: list[UsageBucket]) -> UsageBucket:
    sums = _sums(buckets)
    return UsageBucket(
        "total", sums.calls, sums.tokens_in, sums.tokens_out, sums.cost_usd, sums.estimated_cost_usd
    )


@router.get(
    "/api/ai/jobs/{jobId}/usage",
    response_model=JobUsageResponse,
    tags=["jobs"],
    summary="What one of your jobs' calls cost, per attempt",
    description=(
        "Every provider call of the job (failed ones included) summed, and per attempt with "
        "the error codes of its failed calls and each call (`providerCalls`: its cost and "
        "`costBasis`, the model as echoed and the model it was `pricedAs`, its tokens with "
        "their cached and reasoning parts); with the token estimate, answer budget, cost cap "
        "and reservation create fixed. A call whose answer was not read to its end (a cancel, "
        "a timeout, a worker drain, a broken connection) is charged on the engine's estimate "
        "(`costBasis: estimated`, summed in `estimatedCostUsd`). Owner or admin; anyone "
        "else's job is 404 `JOB_NOT_FOUND`, as a missing one."
    ),
)
async def job_usage(job_id: JobId, state: State, principal: User) -> JobUsageResponse:
    async with state.sessionmaker() as s:
        money = await job_money(s, job_id)
        # The owner rule before any read of the job's usage: a stranger learns nothing.
        if money is None or not can_see(principal, money.user_id):
            raise not_found()
        attempts = await job_attempts(s, job_id)
    return JobUsageResponse(
        job_id=job_id,
        calls=sum(a.calls for a in attempts),
        tokens_in=sum(a.tokens_in for a in attempts),
        tokens_out=sum(a.tokens_out for a in attempts),
        cost_usd=sum((a.cost_usd for a in attempts), Decimal(0)),
        estimated_cost_usd=sum((a.estimated_cost_usd for a in attempts), Decimal(0)),
        reserved_cost_usd=money.reserved_cost_usd,
        max_cost_usd=money.max_cost_usd,
        estimated_input_tokens=money.estimated_input_tokens,
        max_output_tokens=money.max_output_tokens,
        attempts=[
            AttemptUsageOut(
                attempt=a.attempt,
                calls=a.calls,
                tokens_in=a.tokens_in,
                tokens_out=a.tokens_out,
                cost_usd=a.cost_usd,
                error_codes=a.error_codes,
                estimated_cost_usd=a.estimated_cost_usd,
                provider_calls=[
                    ProviderCallOut(
                        cost_usd=c.cost_usd,
                        cost_basis="estimated" if c.estimated else "reported",
                        model=c.model,
                        priced_as=c.priced_as,
                        tokens_in=c.tokens_in,
                        tokens_out=c.tokens_out,
                        cached_input_tokens=c.cached_input_tokens,
                        reasoning_tokens=c.reasoning_tokens,
                        service_tier=c.service_tier,
                    )
                    for c in a.provider_calls
                ],
            )
            for a in attempts
        ],
    )
