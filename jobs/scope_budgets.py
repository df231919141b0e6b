"""Budgets above the user: an organisation's, a team's, a tag's. Whether a job fits every budget
that applies to it, and a budget as the admin API shows it.

A job counts in the budget of its organisation, of each of its teams and of each of its tags
(engine/scopes.py). It is admitted only if, for every one of them, the scope's spend in the
budget's period + the open reservations of the scope's jobs + the job's worst case <= the
limit; its reservation is the job row the same transaction inserts, so it counts in each.
A create locks the applicable budget rows first (db/scope_budgets.py `applicable`, in one
order), so creates of many users racing on one scope decide one after the other, each seeing
the reservations of those before it. A job with no scope reads nothing here.

A refusal is the 429 `QUOTA_EXCEEDED` a user's budget answers (Retry-After: the period's end
when spend alone leaves no room, RESERVATIONS_RETRY_AFTER_S while reservations hold it) and
names the budget (`scope`, `scopeId`, `period`). A reservation's growth before another paid call
(`refusal_to_grow`) is checked the same way, the job's own reservation left out.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from sqlalchemy.ext.asyncio import AsyncSession

from db import scope_budgets as scope_budgets_db
from db.scope_budgets import THRESHOLD_CROSSED, BudgetRow, Held
from db.webhook_deliveries import DeliveryRow
from engine.errors import QuotaExceeded
from engine.scopes import JobScopes
from jobs.costs import (
    RESERVATIONS_RETRY_AFTER_S,
    next_utc_day,
    next_utc_month,
    seconds_until,
    utc_day_start,
    utc_month_start,
)

# The quote's `refusal.limit` of a scope budget.
SCOPE_BUDGET: Final = "scope_budget"


def period_window(period: str, now: dt.datetime) -> tuple[dt.date, dt.datetime]:
    """A budget period's first UTC day and its end (when it resets)."""
    if period == "day":
        return utc_day_start(now).date(), next_utc_day(now)
    return utc_month_start(now).date(), next_utc_month(now)


@dataclass(frozen=True)
class ScopeHolding:
    """A budget and what it holds now: its period's spend and its scope's open reservations."""

    budget: BudgetRow
    held: Held
    since: dt.date
    resets_at: dt.datetime

    @property
    def total_usd(self) -> Decimal:
        return self.held.spent_usd + self.held.reserved_usd

    @property
    def remaining_usd(self) -> Decimal:
        return max(self.budget.limit_usd - self.total_usd, Decimal(0))

    def refusal(self, worst_case_usd: Decimal, now: dt.datetime) -> QuotaExceeded | None:
        """None when a job of `worst_case_usd` fits; else the 429 that names this budget."""
        b, held = self.budget, self.held
        if self.total_usd + worst_case_usd <= b.limit_usd:
            return None
        what = f"The {b.scope} budget {b.scope_id!r} of {b.limit_usd} USD per {b.period}"
        if held.spent_usd + worst_case_usd > b.limit_usd:
            error = QuotaExceeded(
                f"{what} cannot cover this job (up to {worst_case_usd} USD; "
                f"{held.spent_usd} USD spent).",
                retry_after_s=seconds_until(self.resets_at, now),
            )
        else:
            error = QuotaExceeded(
                f"{what} is held by running jobs ({held.reserved_usd} USD reserved, "
                f"{held.spent_usd} USD spent); this job may cost up to {worst_case_usd} USD.",
                retry_after_s=RESERVATIONS_RETRY_AFTER_S,
            )
        return error.named(b.scope, b.scope_id, b.period)


async def standing(
    s: AsyncSession,
    scopes: JobScopes,
    *,
    lock: bool,
    now: dt.datetime,
    excluding: uuid.UUID | None = None,
) -> list[ScopeHolding]:
    """The budgets that apply to a job of `scopes` and what each holds (`lock`: their rows
    locked until the transaction ends, before they are read). A job without scopes: no
    statement; scopes without budgets: one."""
    if not scopes:
        return []
    budgets = await scope_budgets_db.applicable(s, list(scopes.pairs()), lock=lock)
    return await holding(s, budgets, now, excluding=excluding)


async def holding(
    s: AsyncSession,
    budgets: Sequence[BudgetRow],
    now: dt.datetime,
    *,
    excluding: uuid.UUID | None = None,
) -> list[ScopeHolding]:
    """What each of `budgets` holds now, in one statement."""
    windows = [period_window(b.period, now) for b in budgets]
    held = await scope_budgets_db.holdings(
        s, budgets, [since for since, _ in windows], excluding=excluding
    )
    return [
        ScopeHolding(b, h, since, resets)
        for b, h, (since, resets) in zip(budgets, held, windows, strict=True)
    ]


def first_refusal(
    holdings: Sequence[ScopeHolding], worst_case_usd: Decimal, now: dt.datetime
) -> QuotaExceeded | None:
    """The refusal of the first budget (in scope, id order) a job of `worst_case_usd` does not
    fit; None when every one has room."""
    for h in holdings:
        error = h.refusal(worst_case_usd, now)
        if error is not None:
            return error
    return None


async def refusal_to_grow(
    s: AsyncSession, scopes: JobScopes, job_id: uuid.UUID, call_worst_usd: Decimal
) -> str | None:
    """Before a job's reservation grows by `call_worst_usd` (another paid call): the scope
    whose budget cannot hold it (its rows locked first, the job's own reservation left out,
    its spend counted), else None."""
    now = dt.datetime.now(dt.UTC)
    for h in await standing(s, scopes, lock=True, now=now, excluding=job_id):
        if h.total_usd + call_worst_usd > h.budget.limit_usd:
            return h.budget.scope
    return None


async def budget_event_body(s: AsyncSession, row: DeliveryRow) -> dict[str, Any] | None:
    """A budget alert's webhook body, `{type, timestamp, data}` as a job event's, `data` the
    event's payload (scope, scopeId, period, periodStart, threshold, limitUsd, spentUsd); None
    for any other event."""
    if row.event_type != THRESHOLD_CROSSED:
        return None
    data = await scope_budgets_db.event_payload(s, row.event_id)
    if data is None:
        return None
    stamp = row.occurred_at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    return {"type": row.event_type, "timestamp": stamp, "data": data}
