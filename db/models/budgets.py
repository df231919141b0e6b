"""SQLAlchemy models of money above the user: the budgets of an organisation, a team or a tag,
their spend per UTC day, the alerts each sent, and the usage rollup by a job's scopes.

A job's scopes (`ai_job.org_id`, `team_ids`, `tags`) are fixed at its create. Every usage row of
a job that has any raises `ai_scope_usage_daily` (one row per scope and day: what a budget's
spend is read from) and `ai_usage_scoped_daily` (the usage API's rollup by scope) in the same
statement (db/usage.py); a job with none writes neither. The trigger of migration 0037 on
`ai_scope_usage_daily` sends a budget's alerts (db/scope_budgets.py).

The Alembic migrations are the schema; a test keeps the two equal. Base is db/models/base.py's.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Date,
    Index,
    Numeric,
    String,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import TS, Base

# The scopes a budget applies to, as `ai_scope_budget.scope` and the usage rollups name them.
SCOPE_CHECK = "scope IN ('org','team','tag')"


class AiScopeBudget(Base):
    """A budget of one organisation, team or tag: at most `limit_usd` of spend plus open
    reservations per UTC `period` (day or month); `alert_at`: the fractions of the limit at
    which one `ai.budget.threshold_crossed` event is sent per period."""

    __tablename__ = "ai_scope_budget"
    __table_args__ = (
        CheckConstraint(SCOPE_CHECK, name="scope"),
        CheckConstraint("period IN ('day','month')", name="period"),
        CheckConstraint("limit_usd > 0", name="limit_usd"),
    )

    scope: Mapped[str] = mapped_column(String(8), primary_key=True)
    scope_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    limit_usd: Mapped[Decimal] = mapped_column(Numeric(18, 8))
    period: Mapped[str] = mapped_column(String(8))
    alert_at: Mapped[list[Decimal]] = mapped_column(
        ARRAY(Numeric), server_default=text("'{}'::numeric[]")
    )
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())


class AiScopeUsageDaily(Base):
    """What the calls of a scope's jobs cost per UTC day (a job of two teams counts in both):
    a budget's spend in its period is a range of this primary key."""

    __tablename__ = "ai_scope_usage_daily"
    __table_args__ = (CheckConstraint(SCOPE_CHECK, name="scope"),)

    scope: Mapped[str] = mapped_column(String(8), primary_key=True)
    scope_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    calls: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    cost_usd: Mapped[Decimal] = mapped_column(Numeric(20, 8), server_default=text("0"))


class AiBudgetAlert(Base):
    """A threshold of a budget sent in one period: at most one event per (scope, period,
    period start, threshold), whatever the budget's later changes."""

    __tablename__ = "ai_budget_alert"

    scope: Mapped[str] = mapped_column(String(8), primary_key=True)
    scope_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    period: Mapped[str] = mapped_column(String(8), primary_key=True)
    period_start: Mapped[date] = mapped_column(Date, primary_key=True)
    threshold: Mapped[Decimal] = mapped_column(Numeric, primary_key=True)
    spent_usd: Mapped[Decimal] = mapped_column(Numeric(20, 8))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())


class AiUsageScopedDaily(Base):
    """The usage rollup of jobs that have a scope, per UTC day, user, job type, model,
    credential mode and the job's scopes (`scope_key`: a hash of its org, teams and tags, which
    are kept beside it): the admin usage API groups and filters by organisation, team and tag
    here, each row counted once in a total whatever its number of scopes."""

    __tablename__ = "ai_usage_scoped_daily"
    __table_args__ = (Index("ix_ai_usage_scoped_daily_org", "org_id", "day"),)

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    job_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    credential_mode: Mapped[str] = mapped_column(String(32), primary_key=True)
    scope_key: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str | None] = mapped_column(String(64))
    team_ids: Mapped[list[str]] = mapped_column(
        ARRAY(String(64)), server_default=text("'{}'::varchar[]")
    )
    tags: Mapped[list[str]] = mapped_column(
        ARRAY(String(64)), server_default=text("'{}'::varchar[]")
    )
    calls: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    tokens_in: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    tokens_out: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    cost_usd: Mapped[Decimal] = mapped_column(Numeric(20, 8), server_default=text("0"))
    estimated_cost_usd: Mapped[Decimal] = mapped_column(Numeric(20, 8), server_default=text("0"))
