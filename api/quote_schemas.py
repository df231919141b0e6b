"""The quote's response models (`POST /api/ai/jobs/quote`): what a job would cost, on each
service tier, and whether a create now would be admitted. USD amounts as 8-place decimal
strings."""

from __future__ import annotations

import datetime as dt
from datetime import datetime
from decimal import Decimal
from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from api.usage_schemas import UsdAmount
from engine.tiers import ServiceTier
from jobs.service import Quote, RefusalLimit
from jobs.views import Camel


class QuoteBudget(Camel):
    window: Literal["daily", "monthly"]
    # Whose budget: yours (`user`, `scopeId` your user id) or your organisation's, a team's or
    # a tag's that applies to the job; `period` is the window's (`day`, `month`).
    scope: Literal["user", "org", "team", "tag"] = "user"
    scope_id: str | None = None
    period: Literal["day", "month"] = "day"
    limit_usd: UsdAmount
    spent_usd: UsdAmount  # calls in the window
    reserved_usd: UsdAmount  # the open reservations of your active jobs
    remaining_usd: UsdAmount
    resets_at: datetime


class QuoteRefusal(Camel):
    code: str  # the error code a create would answer with (TOO_MANY_JOBS, QUOTA_EXCEEDED)
    limit: RefusalLimit
    message: str
    retry_after_s: int  # what a create's Retry-After would say
    until: datetime  # now + retryAfterS
    # A cost budget's refusal names the budget, as a create's problem body does (null for a
    # job quota): `user`, `org`, `team` or `tag`, its id, and its period.
    scope: Literal["user", "org", "team", "tag"] | None = None
    scope_id: str | None = None
    period: Literal["day", "month"] | None = None


class TierPriceOut(Camel):
    """What the job would cost on one service tier."""

    service_tier: ServiceTier
    estimated_cost_usd: UsdAmount
    worst_case_cost_usd: UsdAmount  # what a create on this tier would reserve
    available: bool = Field(
        description="Whether a create may ask for this tier: the job type accepts it, its "
        "provider serves it (a batch API; a discount window), and a cost cap leaves a useful "
        "answer at its price"
    )


class QuoteResponse(Camel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        json_schema_extra={
            "examples": [
                {
                    "jobType": "quiz_generation",
                    "model": "deepseek-chat",
                    "calls": 1,
                    "estimatedInputTokens": 812,
                    "maxOutputTokens": 4096,
                    "expectedOutputTokens": 790,
                    "estimatedCostUsd": "0.00108824",
                    "worstCaseCostUsd": "0.00478001",
                    "maxCostUsd": None,
                    "admitted": True,
                    "refusal": None,
                    "budgets": [],
                    "serviceTier": "standard",
                    "tierPrices": [
                        {
                            "serviceTier": "standard",
                            "estimatedCostUsd": "0.00108824",
                            "worstCaseCostUsd": "0.00478001",
                            "available": True,
                        },
                        {
                            "serviceTier": "batch",
                            "estimatedCostUsd": "0.00054412",
                            "worstCaseCostUsd": "0.00239001",
                            "available": False,
                        },
                        {
                            "serviceTier": "offpeak",
                            "estimatedCostUsd": "0.00054412",
                            "worstCaseCostUsd": "0.00239001",
                            "available": True,
                        },
                    ],
                }
            ]
        },
    )

    job_type: str
    model: str
    calls: int  # provider calls one attempt makes
    estimated_input_tokens: int
    max_output_tokens: int  # each call's answer budget (cut to fit maxCostUsd)
    expected_output_tokens: int
    estimated_cost_usd: UsdAmount
    worst_case_cost_usd: UsdAmount  # what a create reserves against your budgets
    max_cost_usd: UsdAmount | None
    admitted: bool
    refusal: QuoteRefusal | None
    budgets: list[QuoteBudget]
    service_tier: ServiceTier = Field(
        default="standard", description="The tier quoted: the request's, or the type's default"
    )
    tier_prices: list[TierPriceOut] = Field(
        default_factory=list,
        description="The job on each tier (standard, batch, offpeak), so a client sees what "
        "waiting saves; the top-level figures are the quoted tier's",
    )


def quote_response(q: Quote, user_id: str, max_cost_usd: Decimal | None) -> QuoteResponse:
    """The answer to a quote: its figures, its refusal (naming the budget that refuses, when a
    budget does) and every budget that applies: the user's own and those of the job's
    organisation, teams and tags."""
    e, now = q.checked.estimate, dt.datetime.now(dt.UTC)
    refusal = None
    if q.refusal is not None:
        after = q.refusal.error.retry_after_s or 1
        named = getattr(q.refusal.error, "problem_extra", {})
        refusal = QuoteRefusal(
            code=q.refusal.error.code,
            limit=q.refusal.limit,
            message=q.refusal.error.public_message,
            retry_after_s=after,
            until=now + dt.timedelta(seconds=after),
            scope=named.get("scope"),
            scope_id=named.get("scopeId"),
            period=named.get("period"),
        )
    return QuoteResponse(
        job_type=q.checked.job_type.job_type,
        model=e.model,
        calls=e.calls,
        estimated_input_tokens=e.input_tokens,
        max_output_tokens=e.output_budget,
        expected_output_tokens=e.expected_output_tokens,
        estimated_cost_usd=e.estimated_cost_usd,
        worst_case_cost_usd=e.worst_case_cost_usd,
        max_cost_usd=max_cost_usd,
        admitted=refusal is None,
        refusal=refusal,
        budgets=[
            QuoteBudget(
                window=w.name,
                scope="user",
                scope_id=user_id,
                period="day" if w.name == "daily" else "month",
                limit_usd=w.limit_usd,
                spent_usd=held.spent_usd,
                reserved_usd=held.reserved_usd,
                remaining_usd=max(w.limit_usd - held.total_usd, Decimal(0)),
                resets_at=w.resets_at,
            )
            for w, held in q.budgets
        ]
        + [
            QuoteBudget(
                window="daily" if h.budget.period == "day" else "monthly",
                scope=h.budget.scope,
                scope_id=h.budget.scope_id,
                period=h.budget.period,
                limit_usd=h.budget.limit_usd,
                spent_usd=h.held.spent_usd,
                reserved_usd=h.held.reserved_usd,
                remaining_usd=h.remaining_usd,
                resets_at=h.resets_at,
            )
            for h in q.scope_budgets
        ],
        service_tier=q.checked.service_tier,
        tier_prices=[
            TierPriceOut.model_validate(t, from_attributes=True) for t in q.checked.tier_prices
        ],
    )
