"""SQLAlchemy models of the usage tables: one row per provider call (`ai_usage_log`) and its
daily rollup (`ai_usage_daily`), written together by db/usage.py.

The Alembic migrations are the schema; a test keeps the two equal. Base is db/models/base.py's.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Date,
    ForeignKey,
    Index,
    Integer,
    Numeric,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import TS, Base


class AiUsageLog(Base):
    __tablename__ = "ai_usage_log"
    __table_args__ = (
        CheckConstraint("cost_basis IN ('reported','estimated')", name="cost_basis"),
        CheckConstraint("service_tier IN ('standard','batch','offpeak')", name="service_tier"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE"), index=True
    )
    user_id: Mapped[str] = mapped_column(String(128))
    attempt_no: Mapped[int] = mapped_column(Integer)
    credential_mode: Mapped[str] = mapped_column(String(32))
    provider: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    tokens_in: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    tokens_out: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    cost_usd: Mapped[Decimal] = mapped_column(Numeric(18, 8), server_default=text("0"))
    latency_ms: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    error_code: Mapped[str | None] = mapped_column(String(64))
    chunk_no: Mapped[int | None] = mapped_column(Integer)  # a chunked job's chunk; else None
    # Which call of the job (`ai_job.call_seq` at its attempt's take); NULL before it existed.
    call_no: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    # How the cost was found: the provider's usage, or the engine's bound on a call whose
    # answer it did not read to the end (jobs/charging.py).
    cost_basis: Mapped[str] = mapped_column(String(16), server_default=text("'reported'"))
    priced_as: Mapped[str | None] = mapped_column(String(128))  # the model whose price it paid
    cached_input_tokens: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    reasoning_tokens: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # The tier the call was priced at (providers/pricing.py `Price.at_tier`).
    service_tier: Mapped[str] = mapped_column(Text, server_default=text("'standard'"))
    # The structured-output form the call was asked with (providers/structured.py).
    structured_output: Mapped[str | None] = mapped_column(String(16))


Index("ix_ai_usage_log_user_created", AiUsageLog.user_id, AiUsageLog.created_at)
# A call's one identity (job, attempt, chunk, call): the insert does nothing on a repeat.
Index(
    "ux_ai_usage_log_call",
    AiUsageLog.job_id,
    AiUsageLog.attempt_no,
    AiUsageLog.chunk_no,
    AiUsageLog.call_no,
    unique=True,
    postgresql_nulls_not_distinct=True,
    postgresql_where=text("call_no IS NOT NULL"),
)


class AiUsageDaily(Base):
    """`ai_usage_log` rolled up per UTC day, user, job type, model and credential mode, in the
    transaction that writes each usage row: budgets and the usage API read this, so their cost
    does not grow with the number of calls."""

    __tablename__ = "ai_usage_daily"
    __table_args__ = (Index("ix_ai_usage_daily_user_day", "user_id", "day"),)

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    job_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    credential_mode: Mapped[str] = mapped_column(String(32), primary_key=True)
    calls: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    tokens_in: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    tokens_out: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    cost_usd: Mapped[Decimal] = mapped_column(Numeric(20, 8), server_default=text("0"))
    # The share of cost_usd charged on the engine's estimate (cost_basis 'estimated').
    estimated_cost_usd: Mapped[Decimal] = mapped_column(Numeric(20, 8), server_default=text("0"))


class AiCallMark(Base):
    """A provider call EXECUTE is about to send: written in the first transaction of its attempt
    (or of a fallback move), before the call goes out, with what the call is charged if nothing
    of its answer is ever known (its worst case, `jobs/call_marks.py`). The call's usage row
    deletes it in the same statement (db/usage.py INSERT). One left behind is a call whose
    worker died during it: the next attempt's take, or the job's failed or cancelled ending,
    charges it (db/call_marks.py `CHARGE_DEAD`), so every call sent is charged before the job
    ends."""

    __tablename__ = "ai_call_mark"

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE"), primary_key=True
    )
    call_no: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt_no: Mapped[int] = mapped_column(Integer)
    chunk_no: Mapped[int | None] = mapped_column(Integer)
    user_id: Mapped[str] = mapped_column(String(128))
    job_type: Mapped[str] = mapped_column(String(64))
    credential_mode: Mapped[str] = mapped_column(String(32))
    provider: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    priced_as: Mapped[str | None] = mapped_column(String(128))
    tokens_in: Mapped[int] = mapped_column(Integer)
    tokens_out: Mapped[int] = mapped_column(Integer)
    cost_usd: Mapped[Decimal] = mapped_column(Numeric(18, 8))
    service_tier: Mapped[str] = mapped_column(Text, server_default=text("'standard'"))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
