"""Cost budgets that hold under concurrency: what a user has spent and reserved.

A user's committed cost in a budget window (a UTC day or month) is what their calls cost in it
(`ai_usage_daily`) plus the open reservations of their active jobs: each queued or running job
holds `reserved_cost_usd` (its worst case, fixed at create) less what its calls have cost so far
(`spent_cost_usd`, which the same usage write raises). A job that ends holds nothing: its
actual cost stays in the spend. Creates of one user run under a transaction-scoped advisory
lock (`lock_user`), so "committed + this job's worst case ≤ budget" checked under it cannot be
overrun by a concurrent create; EXECUTE takes the same lock before topping a job's reservation
up for another call.

Every function runs in the caller's transaction and never commits.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.lifecycle import ACTIVE_SQL


@dataclass(frozen=True)
class Committed:
    spent_usd: Decimal  # calls in the window
    reserved_usd: Decimal  # active jobs' open reservations (any window: they land in this one)

    @property
    def total_usd(self) -> Decimal:
        return self.spent_usd + self.reserved_usd


async def lock_user(s: AsyncSession, user_id: str) -> None:
    """Serialise one user's budget decisions until the transaction ends. The same key as the
    create quotas' lock: a create and a top-up of the same user never interleave."""
    await s.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended('ai_job_quota:' || :u, 0))"),
        {"u": user_id},
    )


async def open_reservations(
    s: AsyncSession, user_id: str, *, excluding: uuid.UUID | None = None
) -> Decimal:
    """What a user's active jobs still hold beyond what they have spent (the partial index on
    active jobs serves it)."""
    value = (
        await s.execute(
            text(
                f"""
                SELECT coalesce(sum(greatest(reserved_cost_usd - spent_cost_usd, 0)), 0)
                FROM ai_job
                WHERE user_id = :u AND {ACTIVE_SQL}
                  AND (CAST(:x AS uuid) IS NULL OR id <> CAST(:x AS uuid))
                """
            ),
            {"u": user_id, "x": excluding},
        )
    ).scalar_one()
    return Decimal(value)


async def spent_since(s: AsyncSession, user_id: str, day: dt.date) -> Decimal:
    """A user's call costs from UTC day `day` on, from the daily rollup."""
    value = (
        await s.execute(
            text(
                "SELECT coalesce(sum(cost_usd), 0) FROM ai_usage_daily "
                "WHERE user_id = :u AND day >= :d"
            ),
            {"u": user_id, "d": day},
        )
    ).scalar_one()
    return Decimal(value)


async def committed(
    s: AsyncSession, user_id: str, since: dt.date, *, excluding: uuid.UUID | None = None
) -> Committed:
    return Committed(
        await spent_since(s, user_id, since),
        await open_reservations(s, user_id, excluding=excluding),
    )


async def reserve(s: AsyncSession, job_id: uuid.UUID, reserved_usd: Decimal) -> None:
    """Raise a job's reservation to `reserved_usd` (never lowers it)."""
    await s.execute(
        text(
            "UPDATE ai_job SET reserved_cost_usd = greatest(reserved_cost_usd, :r) WHERE id = :id"
        ),
        {"id": job_id, "r": reserved_usd},
    )


@dataclass(frozen=True)
class Money:
    reserved_usd: Decimal  # every active job's open reservation
    spent_today_usd: Decimal  # every call's cost this UTC day
    spent_month_usd: Decimal  # and this UTC month


async def reserved_and_spent(s: AsyncSession) -> Money:
    """The metrics' reserved-versus-spent gauges: open reservations through the partial index
    on active jobs, spend from the rollup's days of this month (a range of its primary key)."""
    row = (
        await s.execute(
            text(
                f"""
                WITH today AS (SELECT (now() AT TIME ZONE 'UTC')::date AS d)
                SELECT (SELECT coalesce(sum(greatest(reserved_cost_usd - spent_cost_usd, 0)), 0)
                        FROM ai_job WHERE {ACTIVE_SQL}) AS reserved,
                       (SELECT coalesce(sum(cost_usd), 0) FROM ai_usage_daily, today
                        WHERE day = today.d) AS spent_today,
                       (SELECT coalesce(sum(cost_usd), 0) FROM ai_usage_daily, today
                        WHERE day >= date_trunc('month', today.d)::date) AS spent_month
                """
            )
        )
    ).one()
    return Money(Decimal(row.reserved), Decimal(row.spent_today), Decimal(row.spent_month))
