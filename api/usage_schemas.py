"""The usage API's response models: sums per job, attempt and provider call, reports by day,
job type or model; USD amounts as 8-place decimal strings."""

from __future__ import annotations

import uuid
from datetime import date
from decimal import Decimal
from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from jobs.views import Camel
from jobs.views import UsdAmount as UsdAmount
from jobs.views import usd_text as usd_text

# ---- usage and cost ---------------------------------------------------------------------

UsageGroupBy = Literal["day", "jobType", "model"]
AdminUsageGroupBy = Literal[
    "user", "jobType", "model", "day", "credentialMode", "org", "team", "tag"
]


class UsageSums(Camel):
    calls: int = Field(description="Provider calls, failed ones included", examples=[3])
    tokens_in: int = Field(examples=[1200])
    tokens_out: int = Field(examples=[800])
    cost_usd: UsdAmount
    estimated_cost_usd: UsdAmount = Field(
        default=Decimal(0),
        description="The part of `costUsd` charged on the engine's estimate: calls whose "
        "answer was not read to its end or carried no usage (docs/money.md)",
    )


class ProviderCallOut(Camel):
    """One provider call of an attempt, as its usage row says."""

    cost_usd: UsdAmount
    cost_basis: Literal["reported", "estimated"] = Field(
        description="`reported`: the provider's usage; `estimated`: the engine's bound on a "
        "call whose answer it did not read to the end (never less than it may have cost)"
    )
    model: str = Field(description="The model as the provider echoed it", examples=["m"])
    priced_as: str | None = Field(
        description="The model whose price the call was charged at: the echo when the price "
        "table knows it, else the requested model (what the reservation was made at)",
        examples=["deepseek-chat"],
    )
    tokens_in: int = Field(description="Prompt tokens, cached ones included", examples=[1200])
    tokens_out: int = Field(description="Answer tokens, reasoning ones included", examples=[800])
    cached_input_tokens: int = Field(
        description="Of `tokensIn`, served from the provider's cache (cache-hit price)"
    )
    reasoning_tokens: int = Field(description="Of `tokensOut`, spent reasoning", examples=[0])
    service_tier: Literal["standard", "batch", "offpeak"] = Field(
        default="standard",
        description="The tier the call was priced at: `standard`; `batch`, through the "
        "provider's Batch API at the model's batch price; `offpeak`, inside the provider's "
        "discount window at the window's price",
        examples=["batch"],
    )


class UsageItem(UsageSums):
    key: str = Field(
        description="The group's value: a UTC date `YYYY-MM-DD` (day), a job type, a model, a "
        "user id, a credential mode, or an organisation id, a team id or a tag",
        examples=["2026-01-31"],
    )


class UsageReport(Camel):
    """Spend over UTC days `from`..`to` (inclusive), one item per group in key order. `total`
    counts every call matching the filters once: the sum of the items, except when grouped by
    organisation, team or tag (a job counts in the item of each of its teams and tags, and
    jobs in no item still count in the total)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        json_schema_extra={
            "examples": [
                {
                    "from": "2026-01-01",
                    "to": "2026-01-30",
                    "groupBy": "jobType",
                    "items": [
                        {
                            "key": "flashcard_generation",
                            "calls": 3,
                            "tokensIn": 1200,
                            "tokensOut": 800,
                            "costUsd": "0.00066000",
                        }
                    ],
                    "total": {
                        "calls": 3,
                        "tokensIn": 1200,
                        "tokensOut": 800,
                        "costUsd": "0.00066000",
                    },
                }
            ]
        },
    )

    from_: date = Field(alias="from")
    to: date
    group_by: str
    items: list[UsageItem]
    total: UsageSums


class AttemptUsageOut(UsageSums):
    attempt: int = Field(ge=1, examples=[1])
    error_codes: list[str] = Field(
        description="The error code of each failed call of the attempt, in call order",
        examples=[["PROVIDER_UNAVAILABLE"]],
    )
    provider_calls: list[ProviderCallOut] = Field(
        default_factory=list, description="The attempt's provider calls, in call order"
    )


class JobUsageResponse(UsageSums):
    """A job's calls from its usage log, per attempt, with what create fixed about its tokens
    and money."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        json_schema_extra={
            "examples": [
                {
                    "jobId": "0b6f1f52-8d0e-4c39-9a53-1f1f0f6c2a11",
                    "calls": 2,
                    "tokensIn": 2400,
                    "tokensOut": 800,
                    "costUsd": "0.00066000",
                    "reservedCostUsd": "0.00000000",
                    "maxCostUsd": "0.05000000",
                    "estimatedInputTokens": 1180,
                    "maxOutputTokens": 2048,
                    "attempts": [
                        {
                            "attempt": 1,
                            "calls": 1,
                            "tokensIn": 1200,
                            "tokensOut": 0,
                            "costUsd": "0.00000000",
                            "errorCodes": ["PROVIDER_UNAVAILABLE"],
                        },
                        {
                            "attempt": 2,
                            "calls": 1,
                            "tokensIn": 1200,
                            "tokensOut": 800,
                            "costUsd": "0.00066000",
                            "errorCodes": [],
                        },
                    ],
                }
            ]
        },
    )

    job_id: uuid.UUID
    reserved_cost_usd: UsdAmount = Field(
        description="What is reserved against the user's budgets for this job"
    )
    max_cost_usd: UsdAmount | None = Field(default=None, description="The job's cost cap")
    estimated_input_tokens: int | None = None
    max_output_tokens: int | None = None
    attempts: list[AttemptUsageOut]
