"""The admin usage API's reads by organisation, team and tag, from `ai_usage_scoped_daily`: the
rollup of the usage rows of jobs that have a scope (per UTC day, user, job type, model,
credential mode and the job's scopes), raised by the usage statement itself (db/usage.py).

A row keeps its job's organisation, teams and tags, so a grouping by team counts a row in the
item of each of its teams (`unnest`), a filter by team keeps the rows that hold it, and a total
sums each matching row once, whatever its number of scopes. Jobs with no scope are not here:
a total over every job (no scope filter) is db/usage.py's. Only this module's constants are
spliced into the SQL; every value is a bound parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.usage import GROUPINGS, UsageBucket, UsageFilter, usage_params

# A scope grouping: the key each row contributes, one row of the LATERAL per key it holds.
SCOPE_GROUPINGS: dict[str, str] = {
    "org": "(SELECT d.org_id WHERE d.org_id IS NOT NULL)",
    "team": "unnest(d.team_ids)",
    "tag": "unnest(d.tags)",
}
_SCOPE_FILTERS = (
    ("org_id", "d.org_id = CAST(:org_id AS varchar)"),
    ("team_id", "d.team_ids @> ARRAY[CAST(:team_id AS varchar)]"),
    ("tag", "d.tags @> ARRAY[CAST(:tag AS varchar)]"),
)
_SUMS = """sum(d.calls) AS calls, sum(d.tokens_in) AS tin, sum(d.tokens_out) AS tout,
           sum(d.cost_usd) AS cost, sum(d.estimated_cost_usd) AS est"""


@dataclass(frozen=True)
class ScopeFilter:
    """Only the jobs of this organisation, team and tag (each None: any)."""

    org_id: str | None = None
    team_id: str | None = None
    tag: str | None = None

    def __bool__(self) -> bool:
        return any(getattr(self, name) for name, _ in _SCOPE_FILTERS)


def _where(f: UsageFilter, scopes: ScopeFilter) -> tuple[str, dict[str, Any]]:
    params = usage_params(f)
    # usage_params names the rollup's columns by the filter's fields (db/usage.py `_FILTERS`).
    where = "".join(
        f" AND d.{column} = :{name}"
        for name, column in (
            ("user_id", "user_id"),
            ("job_type", "job_type"),
            ("model", "model"),
            ("credential_mode", "credential_mode"),
        )
        if getattr(f, name)
    )
    for name, condition in _SCOPE_FILTERS:
        value = getattr(scopes, name)
        if value:
            where += f" AND {condition}"
            params[name] = value
    return where, params


def _bucket(key: Any, r: Any) -> UsageBucket:
    return UsageBucket(
        key=key.isoformat() if isinstance(key, date) else str(key),
        calls=int(r.calls or 0),
        tokens_in=int(r.tin or 0),
        tokens_out=int(r.tout or 0),
        cost_usd=Decimal(r.cost or 0),
        estimated_cost_usd=Decimal(r.est or 0),
    )


async def grouped(
    s: AsyncSession, f: UsageFilter, scopes: ScopeFilter, group_by: str
) -> list[UsageBucket]:
    """The scoped rollup over `f` and `scopes`, one bucket per key of `group_by` (a scope
    grouping of SCOPE_GROUPINGS, or a column of db/usage.py's GROUPINGS), in key order."""
    where, params = _where(f, scopes)
    if group_by in SCOPE_GROUPINGS:
        source = f"ai_usage_scoped_daily d CROSS JOIN LATERAL {SCOPE_GROUPINGS[group_by]} AS x(k)"
        key = "x.k"
    else:
        source, key = "ai_usage_scoped_daily d", f"d.{GROUPINGS[group_by]}"
    rows = await s.execute(
        text(
            f"SELECT {key} AS key, {_SUMS} FROM {source} "
            f"WHERE d.day BETWEEN :start AND :end{where} GROUP BY 1 ORDER BY 1"
        ),
        params,
    )
    return [_bucket(r.key, r) for r in rows]


async def total(s: AsyncSession, f: UsageFilter, scopes: ScopeFilter) -> UsageBucket:
    """Every scoped call matching `f` and `scopes`, each counted once."""
    where, params = _where(f, scopes)
    row = (
        await s.execute(
            text(
                f"SELECT {_SUMS} FROM ai_usage_scoped_daily d "
                f"WHERE d.day BETWEEN :start AND :end{where}"
            ),
            params,
        )
    ).one()
    return _bucket("total", row)
