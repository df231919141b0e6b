"""A user's quotas and cost budgets: whether a job may be admitted now, read in one statement.

The limits (jobs/policy.py `CreatePolicy`): active jobs, jobs per UTC day and month, and cost
per UTC day and month. Their counts, spend and reservations come from ONE `db/budgets.py`
`standing` read, for a create (under the user's lock, `lock`), a quote (without it) and an
admin retry (a create) alike, so that all three decide from one snapshot by the same rules.
A refusal is the 429 a create answers with: `TOO_MANY_JOBS` with a short fixed Retry-After for
active jobs, `QUOTA_EXCEEDED` with the window's end (or a few seconds while reservations of
running jobs hold a budget, jobs/costs.py `BudgetWindow.refusal`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.ext.asyncio import AsyncSession

from db import budgets as budgets_db
from engine.errors import QuotaExceeded, TooManyJobs
from jobs.costs import (
    BudgetWindow,
    JobEstimate,
    budget_windows,
    next_utc_day,
    next_utc_month,
    seconds_until,
    utc_day_start,
    utc_month_start,
)
from jobs.policy import CreatePolicy

# Retry-After (seconds) on 429 TOO_MANY_JOBS.
TOO_MANY_JOBS_RETRY_AFTER_S = 5

RefusalLimit = Literal[
    "active_jobs",
    "jobs_per_day",
    "jobs_per_month",
    "daily_cost_budget",
    "monthly_cost_budget",
    "scope_budget",
]


@dataclass(frozen=True)
class Refusal:
    """Which limit refuses a create now, and the 429 that says so."""

    limit: RefusalLimit
    error: TooManyJobs | QuotaExceeded


@dataclass(frozen=True)
class Admission:
    """What the quotas say of a job now: the first limit that refuses it (None: admitted), and
    each cost budget in force with what it holds."""

    refusal: Refusal | None
    budgets: list[tuple[BudgetWindow, budgets_db.Committed]]


@dataclass(frozen=True)
class _JobCount:
    """A jobs-per-window quota in force: its limit and its UTC window."""

    limit_name: Literal["jobs_per_day", "jobs_per_month"]
    limit: int
    per: str
    since: dt.datetime
    resets_at: dt.datetime


class Quotas:
    """The create policy's quotas and budgets, decided from one read of the user's standing."""

    def __init__(self, policy: CreatePolicy) -> None:
        self._policy = policy

    @property
    def limited(self) -> bool:
        """Whether any quota or budget is in force (0 is unlimited): else nothing is read."""
        p = self._policy
        return bool(
            p.max_active_jobs
            or p.max_jobs_per_day
            or p.max_jobs_per_month
            or p.max_cost_usd_per_day
            or p.max_cost_usd_per_month
        )

    def windows(self, now: dt.datetime) -> list[BudgetWindow]:
        """The user cost budgets in force (daily, monthly), each with its window."""
        return budget_windows(
            self._policy.max_cost_usd_per_day, self._policy.max_cost_usd_per_month, now
        )

    @staticmethod
    async def lock(s: AsyncSession, user_id: str) -> None:
        """Serialise the user's creates (and budget top-ups) until the transaction ends, so that
        count-then-insert cannot overshoot; taken before `admission` reads."""
        await budgets_db.lock_user(s, user_id)

    async def admission(self, s: AsyncSession, user_id: str, estimate: JobEstimate) -> Admission:
        """The first quota or budget a job of `estimate` would break now, and the budgets'
        holdings, from one statement. Create calls it under the user's lock and raises the
        refusal; a quote calls it without and reports."""
        if not self.limited:
            return Admission(None, [])
        p, now = self._policy, dt.datetime.now(dt.UTC)
        counts = [
            c
            for c in (
                _JobCount(
                    "jobs_per_day", p.max_jobs_per_day, "day", utc_day_start(now), next_utc_day(now)
                ),
                _JobCount(
                    "jobs_per_month",
                    p.max_jobs_per_month,
                    "month",
                    utc_month_start(now),
                    next_utc_month(now),
                ),
            )
            if c.limit
        ]
        windows = self.windows(now)
        read = await budgets_db.standing(
            s,
            user_id,
            active=bool(p.max_active_jobs),
            created_since=[c.since for c in counts],
            spent_since=[w.since for w in windows],
            reserved=bool(windows),
        )
        budgets = [(w, read.committed(i)) for i, w in enumerate(windows)]
        return Admission(self._refusal(user_id, read, counts, budgets, estimate, now), budgets)

    def _refusal(
        self,
        user_id: str,
        read: budgets_db.Standing,
        counts: list[_JobCount],
        budgets: list[tuple[BudgetWindow, budgets_db.Committed]],
        estimate: JobEstimate,
        now: dt.datetime,
    ) -> Refusal | None:
        """The first limit broken, in the order active jobs, jobs per day, per month, the daily
        budget, the monthly budget; None when every one has room."""
        most = self._policy.max_active_jobs
        if most and read.active_jobs >= most:
            # A slot frees when one of the user's jobs ends, which no clock predicts: a short,
            # fixed hint, so a polite client neither hammers nor waits a job's whole timeout.
            return Refusal(
                "active_jobs",
                TooManyJobs(
                    f"At most {most} active jobs per user.",
                    retry_after_s=TOO_MANY_JOBS_RETRY_AFTER_S,
                ),
            )
        for count, created in zip(counts, read.jobs_since, strict=True):
            if created >= count.limit:
                return Refusal(
                    count.limit_name,
                    QuotaExceeded(
                        f"At most {count.limit} jobs per user per {count.per}.",
                        retry_after_s=seconds_until(count.resets_at, now),
                    ),
                )
        for window, held in budgets:
            error = window.refusal(held, estimate.worst_case_cost_usd, now)
            if error is not None:
                daily = window.name == "daily"
                return Refusal(
                    "daily_cost_budget" if daily else "monthly_cost_budget",
                    error.named("user", user_id, "day" if daily else "month"),
                )
        return None
