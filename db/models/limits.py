"""SQLAlchemy models of the API's cluster-wide limits: the per-user request buckets and the
leases that count a user's event streams across processes.

The Alembic migrations are the schema; a test keeps the two equal. Base is db/models/base.py's.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Boolean, Float, Index, String, func, text
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import TS, Base


class ApiRateBucket(Base):
    """One row per user: the token bucket of its creates and quotes, refilled in SQL from
    `refilled_at` by the one statement that takes from it (db/rate_limits.py), so every API
    process draws on the same bucket. A missing row is a full bucket."""

    __tablename__ = "api_rate_bucket"

    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    refilled_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    # Whether the last take got its request's worth (what the statement returns).
    granted: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))


class CapLease(Base):
    """One slot of a per-user cap held by a process (`kind`: 'stream'), renewed while it is
    held and expiring on its own, so a killed process's slots come back (db/caps.py)."""

    __tablename__ = "cap_lease"
    __table_args__ = (Index("ix_cap_lease_user", "kind", "user_id", "expires_at"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    user_id: Mapped[str] = mapped_column(String(128))
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime] = mapped_column(TS)
