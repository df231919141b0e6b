"""Budgets of an organisation, a team or a tag (`ai_scope_budget`), and what each holds: the
spend of its period (`ai_scope_usage_daily`, raised by every usage row of a job of the scope,
db/usage.py) and the open reservations of the scope's jobs (db/budgets.py
`open_reservations_sql`: the same notion a user's budgets read).

Races: a create, a retry or a reservation's growth that must hold locks the budget rows that
apply to its job (`applicable(lock=True)`: `SELECT ... ORDER BY scope, scope_id FOR UPDATE`,
rows locked in that order, so two transactions of overlapping scopes never wait on each other
in a cycle), then reads what they hold (`holdings`: a new statement, so it sees every job that
committed before the locks were granted) and writes its job's reservation in the same
transaction. A budget's PUT and DELETE take the same row lock. A user's own budget lock
(db/budgets.py `lock_user`) is always taken before these.

Every function runs in the caller's transaction and never commits; statements interpolate only
this module's constants.
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

from db.budgets import open_reservations_sql


@dataclass(frozen=True)
class BudgetRow:
    scope: str  # org, team, tag
    scope_id: str
    limit_usd: Decimal
    period: str  # day, month
    alert_at: list[Decimal]
    created_at: dt.datetime
    updated_at: dt.datetime


_COLUMNS = "scope, scope_id, limit_usd, period, alert_at, created_at, updated_at"

# The jobs of one scope, as a condition on `ai_job j` with the scope's id in the parameter
# named `{p}`: each repeats the predicate of its partial index (db/models/jobs.py), so the
# open reservations of a scope are read through it.
_SCOPE_JOBS = {
    "org": "j.org_id IS NOT NULL AND j.org_id = CAST(:{p} AS varchar)",
    "team": "j.team_ids <> '{{}}' AND j.team_ids @> ARRAY[CAST(:{p} AS varchar)]",
    "tag": "j.tags <> '{{}}' AND j.tags @> ARRAY[CAST(:{p} AS varchar)]",
}
_OTHER_JOBS = " AND (CAST(:x AS uuid) IS NULL OR j.id <> CAST(:x AS uuid))"

_APPLICABLE = f"""
    SELECT {", ".join("b." + c for c in _COLUMNS.split(", "))}
    FROM ai_scope_budget b
    JOIN unnest(CAST(:scopes AS text[]), CAST(:ids AS text[])) AS x(scope, scope_id)
      ON b.scope = x.scope AND b.scope_id = x.scope_id
    ORDER BY b.scope, b.scope_id
"""
_APPLICABLE_READ = text(_APPLICABLE)
_APPLICABLE_LOCK = text(_APPLICABLE + " FOR UPDATE OF b")


def _row(r: Any) -> BudgetRow:
    return BudgetRow(
        scope=r.scope,
        scope_id=r.scope_id,
        limit_usd=Decimal(r.limit_usd),
        period=r.period,
        alert_at=[Decimal(a) for a in r.alert_at],
        created_at=r.created_at,
        updated_at=r.updated_at,
    )


async def applicable(
    s: AsyncSession, pairs: Sequence[tuple[str, str]], *, lock: bool
) -> list[BudgetRow]:
    """The budgets of these (scope, id) pairs, in (scope, id) order; `lock`: each row locked
    until the caller's transaction ends, in that order (see the module's text)."""
    if not pairs:
        return []
    params = {"scopes": [p[0] for p in pairs], "ids": [p[1] for p in pairs]}
    rows = await s.execute(_APPLICABLE_LOCK if lock else _APPLICABLE_READ, params)
    return [_row(r) for r in rows]


@dataclass(frozen=True)
class Held:
    spent_usd: Decimal  # the scope's calls in the budget's period
    reserved_usd: Decimal  # the open reservations of the scope's jobs (any period)


async def holdings(
    s: AsyncSession,
    budgets: Sequence[BudgetRow],
    since: Sequence[dt.date],
    *,
    excluding: uuid.UUID | None = None,
) -> list[Held]:
    """What each budget holds, in ONE statement: its scope's spend from `since[i]` on (the
    budget's period start) and the open reservations of its scope's jobs other than
    `excluding` (a job growing its own). Takes no lock (`applicable(lock=True)` comes first)."""
    if not budgets:
        return []
    params: dict[str, Any] = {"x": excluding}
    parts = []
    for i, (b, day) in enumerate(zip(budgets, since, strict=True)):
        params.update({f"s{i}": b.scope, f"i{i}": b.scope_id, f"d{i}": day})
        parts.append(
            "(SELECT coalesce(sum(cost_usd), 0) FROM ai_scope_usage_daily "
            f"WHERE scope = :s{i} AND scope_id = :i{i} AND day >= :d{i})"
        )
        parts.append(open_reservations_sql(_SCOPE_JOBS[b.scope].format(p=f"i{i}") + _OTHER_JOBS))
    row = tuple((await s.execute(text(f"SELECT {', '.join(parts)}"), params)).one())
    return [Held(Decimal(row[2 * i]), Decimal(row[2 * i + 1])) for i in range(len(budgets))]


# ---- the admin API's writes and reads ---------------------------------------------------------


_PUT = text(
    f"""
    INSERT INTO ai_scope_budget AS b (scope, scope_id, limit_usd, period, alert_at)
    VALUES (:scope, :id, :limit, :period, CAST(:alert AS numeric[]))
    ON CONFLICT (scope, scope_id) DO UPDATE SET
        limit_usd = EXCLUDED.limit_usd, period = EXCLUDED.period, alert_at = EXCLUDED.alert_at,
        updated_at = now()
    RETURNING {_COLUMNS}
    """
)


async def put(
    s: AsyncSession,
    scope: str,
    scope_id: str,
    *,
    limit_usd: Decimal,
    period: str,
    alert_at: Sequence[Decimal],
) -> BudgetRow:
    """Create or replace a budget (its row locked until the caller's transaction ends); the
    spend of its scope is not touched, nor the alerts already sent."""
    params = {
        "scope": scope,
        "id": scope_id,
        "limit": limit_usd,
        "period": period,
        "alert": list(alert_at),
    }
    return _row((await s.execute(_PUT, params)).one())


async def get(s: AsyncSession, scope: str, scope_id: str) -> BudgetRow | None:
    r = await s.execute(
        text(f"SELECT {_COLUMNS} FROM ai_scope_budget WHERE scope = :scope AND scope_id = :id"),
        {"scope": scope, "id": scope_id},
    )
    found = r.first()
    return _row(found) if found is not None else None


async def delete(s: AsyncSession, scope: str, scope_id: str) -> bool:
    r: Any = await s.execute(
        text("DELETE FROM ai_scope_budget WHERE scope = :scope AND scope_id = :id"),
        {"scope": scope, "id": scope_id},
    )
    return bool(r.rowcount)


async def list_budgets(s: AsyncSession, scope: str | None) -> list[BudgetRow]:
    """Every budget (of one scope, when given), in (scope, id) order."""
    r = await s.execute(
        text(
            f"SELECT {_COLUMNS} FROM ai_scope_budget "
            "WHERE CAST(:scope AS text) IS NULL OR scope = CAST(:scope AS text) "
            "ORDER BY scope, scope_id"
        ),
        {"scope": scope},
    )
    return [_row(x) for x in r]


# ---- alerts ----------------------------------------------------------------------------------

# The event type the alert trigger writes (migration 0037), one of db/webhooks.py ADMIN_EVENTS.
THRESHOLD_CROSSED = "ai.budget.threshold_crossed"


async def event_payload(s: AsyncSession, event_id: int) -> dict[str, Any] | None:
    """A budget alert's `data` (its outbox row's payload, written by the trigger); None when
    the row is gone or is not one."""
    r = await s.execute(
        text(
            "SELECT payload FROM outbox_event "
            "WHERE id = :id AND event_type = :t AND aggregate_type = 'budget'"
        ),
        {"id": event_id, "t": THRESHOLD_CROSSED},
    )
    value = r.scalar_one_or_none()
    return dict(value) if isinstance(value, dict) else None
