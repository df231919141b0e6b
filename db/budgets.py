"""Cost budgets that hold under concurrency: what a user has spent and reserved.

A user's committed cost in a budget window (a UTC day or month) is what their calls cost in it
(`ai_usage_daily`) plus their open reservations (`open_reservations_sql`): each queued or
running job holds `reserved_cost_usd` (its worst case, fixed at create) less what its calls
have cost so far (`spent_cost_usd`, which the same usage write raises), and so does a batch job
that ended while its line could still be sent (it left a closed batch), until that line's
outcome is recorded (the provider may still answer it, and bill it). Any other job that
ended holds nothing: its actual cost stays in the spend. Creates of one user run under a
transaction-scoped advisory lock (`lock_user`), so "committed + this job's worst case ≤
budget" checked under it cannot be overrun by a concurrent create; EXECUTE takes the same lock
before topping a job's reservation up for another call.

Every function runs in the caller's transaction and never commits.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.lifecycle import ACTIVE_SQL

# A job's open reservation: what it reserved less what it has spent, never below 0.
OPEN_USD_SQL = "greatest(j.reserved_cost_usd - j.spent_cost_usd, 0)"
# Jobs with a batch line whose outcome is not recorded yet (db/models/batch.py HELD_ITEM_SQL;
# its partial index `ix_ai_batch_item_held`): one that ended meanwhile (it left a closed batch,
# or was ended by the reconciler) still holds its reservation until then.
_HELD_JOBS = "SELECT job_id FROM ai_batch_item WHERE ended_at IS NULL"


def open_reservations_sql(scope: str) -> str:
    """The one SQL notion of open reservations: the sum of `OPEN_USD_SQL` over the jobs that
    hold one (active, or held by a batch line, as above) among the jobs `scope` selects (a
    condition on `ai_job` aliased `j`, with bind parameters of the caller's statement, e.g.
    `j.user_id = :u`). An expression, for the select list of a budget read. Two sums, so the
    active jobs are read through their partial index and the held ones through theirs; a job is
    never in both (a held job has ended)."""
    return f"""(
        (SELECT coalesce(sum({OPEN_USD_SQL}), 0) FROM ai_job j
         WHERE ({scope}) AND j.{ACTIVE_SQL})
      + (SELECT coalesce(sum({OPEN_USD_SQL}), 0) FROM ai_job j
         WHERE ({scope}) AND NOT j.{ACTIVE_SQL} AND j.id IN ({_HELD_JOBS})))"""


@dataclass(frozen=True)
class Committed:
    spent_usd: Decimal  # calls in the window
    reserved_usd: Decimal  # open reservations (any window: they land in this one)

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


@dataclass(frozen=True)
class Standing:
    """A user's standing against their quotas and budgets, as `standing` reads it. A part not
    asked for reads as 0."""

    active_jobs: int  # queued or running
    jobs_since: tuple[int, ...]  # jobs created since each `created_since` moment, in order
    spent_since: tuple[Decimal, ...]  # call costs from each `spent_since` UTC day on, in order
    reserved_usd: Decimal  # open reservations (any window: they land in each)

    def committed(self, window: int) -> Committed:
        """What the `window`-th spend window holds: its spend and the open reservations."""
        return Committed(self.spent_since[window], self.reserved_usd)


async def standing(
    s: AsyncSession,
    user_id: str,
    *,
    active: bool = False,
    created_since: Sequence[dt.datetime] = (),
    spent_since: Sequence[dt.date] = (),
    reserved: bool = False,
    excluding: uuid.UUID | None = None,
) -> Standing:
    """Every count, spend and reservation a quota or budget decision reads, in ONE statement
    (one round trip, one snapshot): the user's active jobs (the partial index on active jobs),
    jobs created since each moment ((user_id, created_at)), call costs from each UTC day on
    (the daily rollup's primary key) and their open reservations (`open_reservations_sql`) but
    `excluding`'s (a job topping up its own). A part not asked for is not computed. It takes no
    lock: a decision that must hold takes `lock_user` first, in an earlier statement, so that
    this one's snapshot sees every create that committed before the lock was granted."""
    params: dict[str, Any] = {"u": user_id, "x": excluding}
    parts = [
        f"(SELECT count(*) FROM ai_job WHERE user_id = :u AND {ACTIVE_SQL})" if active else "0"
    ]
    for i, moment in enumerate(created_since):
        params[f"c{i}"] = moment
        parts.append(f"(SELECT count(*) FROM ai_job WHERE user_id = :u AND created_at >= :c{i})")
    for i, day in enumerate(spent_since):
        params[f"s{i}"] = day
        parts.append(
            "(SELECT coalesce(sum(cost_usd), 0) FROM ai_usage_daily "
            f"WHERE user_id = :u AND day >= :s{i})"
        )
    parts.append(
        open_reservations_sql(
            "j.user_id = :u AND (CAST(:x AS uuid) IS NULL OR j.id <> CAST(:x AS uuid))"
        )
        if reserved
        else "0"
    )
    row = tuple((await s.execute(text(f"SELECT {', '.join(parts)}"), params)).one())
    counts = len(created_since)
    return Standing(
        active_jobs=int(row[0]),
        jobs_since=tuple(int(v) for v in row[1 : 1 + counts]),
        spent_since=tuple(Decimal(v) for v in row[1 + counts : -1]),
        reserved_usd=Decimal(row[-1]),
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
    reserved_usd: Decimal  # every open reservation
    spent_today_usd: Decimal  # every call's cost this UTC day
    spent_month_usd: Decimal  # and this UTC month


async def reserved_and_spent(s: AsyncSession) -> Money:
    """The metrics' reserved-versus-spent gauges: every open reservation (`open_reservations_sql`),
    spend from the rollup's days of this month (a range of its primary key)."""
    row = (
        await s.execute(
            text(
                f"""
                WITH today AS (SELECT (now() AT TIME ZONE 'UTC')::date AS d)
                SELECT {open_reservations_sql("TRUE")} AS reserved,
                       (SELECT coalesce(sum(cost_usd), 0) FROM ai_usage_daily, today
                        WHERE day = today.d) AS spent_today,
                       (SELECT coalesce(sum(cost_usd), 0) FROM ai_usage_daily, today
                        WHERE day >= date_trunc('month', today.d)::date) AS spent_month
                """
            )
        )
    ).one()
    return Money(Decimal(row.reserved), Decimal(row.spent_today), Decimal(row.spent_month))
