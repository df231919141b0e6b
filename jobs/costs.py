"""What a job will cost before it runs: its estimated tokens, its answer budget, and its
estimated and worst-case cost at the model's price.

A job makes one provider call per attempt (a chunked job, one per chunk). Each call sends the
prompt and asks for at most `max_tokens` of answer, so one call's worst case is its prompt,
counted with a margin for the estimate's error, plus the whole answer budget, both at the
model's price. That worst case is what create reserves against the user's budgets
(db/budgets.py) and what a per-job cap (`maxCostUsd`) is checked against; when a cap is lower,
the answer budget is cut so that the call cannot cost more than the cap.

Each figure is at the job's service tier (`tier`, with the off-peak window's `discount`;
providers/pricing.py `Price.at_tier`): a batch job is reserved and capped at the batch price,
an off-peak job at the window's price, so a create reserves what its tier's calls will cost.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Literal

from sqlalchemy.ext.asyncio import AsyncSession

from db import budgets as budgets_db
from engine.errors import CostCapTooLow, QuotaExceeded
from providers.pricing import Price, PriceTable

_MILLION = Decimal(1_000_000)
_CENT_FRACTION = Decimal("0.00000001")
# Below this many answer tokens no built-in job type can write a useful answer: a cap that
# leaves less refuses the job rather than running it to a truncated, invalid answer.
MIN_USEFUL_OUTPUT_TOKENS = 256


@dataclass(frozen=True)
class JobEstimate:
    model: str
    calls: int  # provider calls of one attempt (chunks; 1 for a short source)
    input_tokens: int  # estimated prompt tokens over all calls
    output_budget: int  # `max_tokens` of each call
    expected_output_tokens: int  # what the job type expects its answers to take, all calls
    estimated_cost_usd: Decimal  # input at the estimate, answers at the expected size
    worst_case_cost_usd: Decimal  # input with the margin, every answer at its full budget
    call_worst_case_usd: Decimal  # the largest single call's worst case (a retry's top-up)


@dataclass(frozen=True)
class TierPrice:
    """What a job would cost on one service tier (the quote's `tierPrices`), and whether a
    create may ask for that tier (the job type accepts it, its provider serves it, a cap leaves
    a useful answer at its price)."""

    service_tier: str
    estimated_cost_usd: Decimal
    worst_case_cost_usd: Decimal
    available: bool


def _usd(tokens_in: float, tokens_out: float, price: Price) -> Decimal:
    raw = (
        Decimal(str(tokens_in)) * price.usd_per_million_in
        + Decimal(str(tokens_out)) * price.usd_per_million_out
    ) / _MILLION
    return raw.quantize(_CENT_FRACTION, rounding=ROUND_CEILING)


# What a worst case adds to a token estimate (25 %): budgets reserve and per-job caps bound by
# it. docs/benchmarks.md measures the estimate's error per job type; this covers its p95.
ESTIMATE_MARGIN = 0.25


def padded(tokens: int, margin: float) -> int:
    """An estimate with its margin: what a bound that must hold counts."""
    return math.ceil(tokens * (1 + margin))


def estimate_job(
    prompt_tokens: Sequence[int],
    *,
    model: str,
    price: Price,
    output_budget: int,
    expected_output_tokens: int,
    margin: float,
    max_cost_usd: Decimal | None = None,
    tier: str = "standard",
    discount: Decimal | None = None,
) -> JobEstimate:
    """The estimate of a job whose calls send prompts of `prompt_tokens` each (one per call,
    counted by `engine.tokens.count_chat_tokens`), at `price` on `tier` (a standard price and
    its tier, or a price already at its tier, such as `chain_price`'s, with the default
    `standard`: never both, which would discount twice). With `max_cost_usd`,
    the answer budget is cut until the worst case of all calls fits the cap; a cap that leaves
    less than a useful answer (or not even the prompts) raises `CostCapTooLow`, naming the
    numbers."""
    price = price.at_tier(tier, discount)
    calls = max(len(prompt_tokens), 1)
    per_call_in = list(prompt_tokens) or [0]
    input_tokens = sum(per_call_in)
    padded_in = sum(padded(t, margin) for t in per_call_in)
    budget = output_budget
    if max_cost_usd is not None and price.usd_per_million_out > 0:
        room = max_cost_usd - _usd(padded_in, 0, price)
        affordable = (
            math.floor(room * _MILLION / price.usd_per_million_out / calls) if room > 0 else 0
        )
        budget = min(budget, affordable)
        if budget < min(MIN_USEFUL_OUTPUT_TOKENS, output_budget):
            worst = _usd(padded_in, calls * min(MIN_USEFUL_OUTPUT_TOKENS, output_budget), price)
            raise CostCapTooLow(
                f"maxCostUsd {max_cost_usd} is too low for this job: its prompt and the "
                f"smallest useful answer may cost up to {worst} USD on {model}."
            )
    elif max_cost_usd is not None and _usd(padded_in, 0, price) > max_cost_usd:
        raise CostCapTooLow(
            f"maxCostUsd {max_cost_usd} is too low for this job: its prompt may cost up to "
            f"{_usd(padded_in, 0, price)} USD on {model}."
        )
    expected_out = min(expected_output_tokens, budget * calls)
    return JobEstimate(
        model=model,
        calls=calls,
        input_tokens=input_tokens,
        output_budget=budget,
        expected_output_tokens=expected_out,
        estimated_cost_usd=_usd(input_tokens, expected_out, price),
        worst_case_cost_usd=_usd(padded_in, calls * budget, price),
        call_worst_case_usd=_usd(padded(max(per_call_in), margin), budget, price),
    )


def call_worst_case_usd(
    input_tokens: int,
    output_budget: int,
    *,
    price: Price,
    margin: float,
    tier: str = "standard",
    discount: Decimal | None = None,
) -> Decimal:
    """One call's worst case at `tier`: what EXECUTE tops a job's reservation up by before a
    retry."""
    return _usd(padded(input_tokens, margin), output_budget, price.at_tier(tier, discount))


def chain_price(
    prices: PriceTable,
    models: Sequence[str],
    *,
    tier: str = "standard",
    discount: Decimal | None = None,
) -> Price:
    """The price a job whose calls may run on any of `models` (its primary and its fallback
    chain) is reserved and capped at: the highest input and the highest output price among
    them, the primary (the first) at `tier` and the chain at standard (a fallback provider's
    calls are plain calls). Whatever model answers, a call's worst case at its own price
    (`PriceTable.worst_case_cost`) is at most its worst case at this price, so the reservation
    stays a bound however far down the chain the job goes. A batch job has no chain (the
    caller passes its primary alone): its calls go to its provider's Batch API or nowhere."""
    found = [
        prices.price_for(m).at_tier(tier, discount) if i == 0 else prices.price_for(m)
        for i, m in enumerate(models)
    ]
    if len(found) == 1:
        return found[0]
    return Price(
        max(p.usd_per_million_in for p in found),
        max(p.usd_per_million_out for p in found),
        min((p.context_window for p in found if p.context_window is not None), default=None),
    )


# ---- budget windows ---------------------------------------------------------------------

# Retry-After (seconds) when a budget is held by the reservations of running jobs: they end,
# and give back what they did not spend, within a job's run time, which no clock predicts.
RESERVATIONS_RETRY_AFTER_S = 10


@dataclass(frozen=True)
class BudgetWindow:
    name: Literal["daily", "monthly"]
    limit_usd: Decimal
    since: dt.date
    resets_at: dt.datetime

    def refusal(
        self, held: budgets_db.Committed, worst_case_usd: Decimal, now: dt.datetime
    ) -> QuotaExceeded | None:
        """None when a job of `worst_case_usd` fits; else the 429 to answer. When spend alone
        leaves no room, Retry-After is the window's end; when reservations of the user's active
        jobs hold the room, a few seconds (they settle as those jobs end)."""
        if held.total_usd + worst_case_usd <= self.limit_usd:
            return None
        if held.spent_usd + worst_case_usd > self.limit_usd:
            return QuotaExceeded(
                f"The {self.name} AI cost budget of {self.limit_usd} USD cannot cover this job "
                f"(up to {worst_case_usd} USD; {held.spent_usd} USD spent).",
                retry_after_s=seconds_until(self.resets_at, now),
            )
        return QuotaExceeded(
            f"The {self.name} AI cost budget of {self.limit_usd} USD is held by your running "
            f"jobs ({held.reserved_usd} USD reserved, {held.spent_usd} USD spent); this job may "
            f"cost up to {worst_case_usd} USD.",
            retry_after_s=RESERVATIONS_RETRY_AFTER_S,
        )


def budget_windows(per_day: float, per_month: float, now: dt.datetime) -> list[BudgetWindow]:
    """The user cost budgets in force (0: none), each with its UTC window."""
    out = []
    if per_day:
        out.append(
            BudgetWindow(
                "daily", Decimal(str(per_day)), utc_day_start(now).date(), next_utc_day(now)
            )
        )
    if per_month:
        out.append(
            BudgetWindow(
                "monthly",
                Decimal(str(per_month)),
                utc_month_start(now).date(),
                next_utc_month(now),
            )
        )
    return out


def utc_day_start(now: dt.datetime) -> dt.datetime:
    return now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def utc_month_start(now: dt.datetime) -> dt.datetime:
    return utc_day_start(now).replace(day=1)


def next_utc_day(now: dt.datetime) -> dt.datetime:
    return utc_day_start(now) + dt.timedelta(days=1)


def next_utc_month(now: dt.datetime) -> dt.datetime:
    start = utc_month_start(now)
    return (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )


def seconds_until(moment: dt.datetime, now: dt.datetime) -> int:
    return max(1, int((moment - now).total_seconds()))


async def cover_next_call(
    s: AsyncSession,
    *,
    job_id: uuid.UUID,
    user_id: str,
    reserved_usd: Decimal,
    spent_usd: Decimal,
    max_cost_usd: Decimal | None,
    call_worst_usd: Decimal,
    windows: Sequence[BudgetWindow],
    scopes_refusal: Callable[[Decimal], Awaitable[str | None]] | None = None,
) -> str | None:
    """Before a job's next call (a retry after a paid answer), reserve what it may cost. The
    create reserved one call's worst case; when what the job has spent plus another worst case
    exceeds that, the reservation grows under the user's budget lock, as a create's would, and
    only if `scopes_refusal` (the budgets of the job's organisation, teams and tags,
    jobs/scope_budgets.py) lets it. None when the call is covered; else what refuses it ("cap",
    "daily", "monthly", or the scope: "org", "team", "tag"): the job stops with
    BUDGET_EXHAUSTED rather than spend past a limit."""
    needed = spent_usd + call_worst_usd
    if needed <= reserved_usd:
        return None
    if max_cost_usd is not None and needed > max_cost_usd:
        return "cap"
    if windows:
        await budgets_db.lock_user(s, user_id)
        # Every window's spend and the other jobs' reservations in one statement.
        read = await budgets_db.standing(
            s, user_id, spent_since=[w.since for w in windows], reserved=True, excluding=job_id
        )
        for i, w in enumerate(windows):
            # What a window holds counts this job's spend in it, not its reservation: the job
            # will hold `call_worst_usd` beyond what it spent.
            if read.committed(i).total_usd + call_worst_usd > w.limit_usd:
                return w.name
    if scopes_refusal is not None:
        refused = await scopes_refusal(call_worst_usd)
        if refused is not None:
            return refused
    await budgets_db.reserve(s, job_id, needed)
    return None
