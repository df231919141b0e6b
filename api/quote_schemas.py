"""The quote's response models (`POST /api/ai/jobs/quote`): what a job would cost, on each
service tier, and whether a create now would be admitted. USD amounts as 8-place decimal
strings."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from api.usage_schemas import UsdAmount
from engine.tiers import ServiceTier
from jobs.service import RefusalLimit
from jobs.views import Camel


class QuoteBudget(Camel):
    window: Literal["daily", "monthly"]
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
