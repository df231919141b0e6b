"""SQLAlchemy models of the provider admission tables: the shared gate (pause, breaker), the
token buckets and the leases of calls in flight, shared by every worker.

The Alembic migrations are the schema; a test keeps the two equal. Base is db/models/base.py's.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, Float, Identity, Index, Integer, String, func, text
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import TS, Base


class ProviderGateRow(Base):
    """One row per (AI provider, key): a shared pause (429) and circuit breaker (see
    db/provider_gate)."""

    __tablename__ = "provider_gate"

    provider: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_ref: Mapped[str] = mapped_column(
        String(80), primary_key=True, server_default=text("'platform'")
    )
    paused_until: Mapped[datetime | None] = mapped_column(TS)
    consecutive_failures: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    open_until: Mapped[datetime | None] = mapped_column(TS)
    probe_until: Mapped[datetime | None] = mapped_column(TS)


class ProviderLimitRow(Base):
    """One row per (provider, model, key): token buckets for requests and tokens per minute,
    refilled at the configured (or, lower, the provider-announced) rate, shared by every
    worker (db/provider_limits.py)."""

    __tablename__ = "provider_limit"

    provider: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    key_ref: Mapped[str] = mapped_column(String(80), primary_key=True)
    requests_available: Mapped[float] = mapped_column(Float)
    tokens_available: Mapped[float] = mapped_column(Float)
    refilled_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    # What the provider's rate-limit headers announced (x-ratelimit-limit-*), and until when
    # they said nothing is left (x-ratelimit-remaining-* 0 with its reset).
    announced_rpm: Mapped[int | None] = mapped_column(Integer)
    announced_tpm: Mapped[int | None] = mapped_column(Integer)
    blocked_until: Mapped[datetime | None] = mapped_column(TS)


class ProviderCallLease(Base):
    """A provider call in flight under a concurrency limit; expires on its own if its worker
    dies, so a crash never leaks a slot."""

    __tablename__ = "provider_call_lease"
    __table_args__ = (
        Index("ix_provider_call_lease_key", "provider", "model", "key_ref", "expires_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    provider: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    key_ref: Mapped[str] = mapped_column(String(80))
    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    tokens: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    expires_at: Mapped[datetime] = mapped_column(TS)
    # The call's class (`interactive`, `background`: its job type's queue), for the reserved
    # part of the key's concurrency (AI_CAPACITY_RESERVE); NULL: none known.
    job_class: Mapped[str | None] = mapped_column(String(16))


class LimitWaiter(Base):
    """A call waiting for its key's provider limits, in the key's fair queue (per user, in the
    order each entered: db/limit_waiters.py); `expires_at` bounds a waiter nobody looks for."""

    __tablename__ = "limit_waiter"
    __table_args__ = (Index("ix_limit_waiter_key", "provider", "model", "key_ref", "seq"),)

    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    chunk_no: Mapped[int] = mapped_column(Integer, primary_key=True)  # -1: the job's one call
    provider: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    key_ref: Mapped[str] = mapped_column(String(80))
    user_id: Mapped[str] = mapped_column(String(128))
    workflow_id: Mapped[str] = mapped_column(String(255))
    tokens: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    turn: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    seq: Mapped[int] = mapped_column(BigInteger, Identity(always=False))
    woken_at: Mapped[datetime | None] = mapped_column(TS)
    expires_at: Mapped[datetime] = mapped_column(TS)
    # The call's class (as `provider_call_lease.job_class`): a class with a reserved part of the
    # key is served ahead of the others while it waits (db/limit_waiters.py).
    job_class: Mapped[str | None] = mapped_column(String(16))
