"""SQLAlchemy models of flow control's tables: operator pauses, the jobs they hold and the pace
at which held jobs are released (docs/admin.md "Operator pauses").

The Alembic migrations are the schema; a test keeps the two equal. Base is db/models/base.py's.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    ForeignKey,
    Index,
    SmallInteger,
    String,
    Text,
    func,
)
from sqlalchemy import text as sql
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import TS, Base


class AiPause(Base):
    """An operator pause in force: no call of a job it matches starts (every member given equals
    the job's; `model` is the model of the call about to be sent). Deleted when it is lifted,
    by an admin's DELETE or at `expires_at`; the admin audit log keeps its history."""

    __tablename__ = "ai_pause"
    __table_args__ = (
        CheckConstraint(
            "coalesce(job_type, provider, model, user_id) IS NOT NULL", name="matches_something"
        ),
        Index("ix_ai_pause_expires", "expires_at", postgresql_where=sql("expires_at IS NOT NULL")),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    job_type: Mapped[str | None] = mapped_column(String(64))
    provider: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(200))
    user_id: Mapped[str | None] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text)
    expires_at: Mapped[datetime | None] = mapped_column(TS)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    created_by: Mapped[str] = mapped_column(String(128))


class AiPauseHold(Base):
    """A job a pause holds before its call: its workflow waits (no worker slot, no attempt
    spent) until the pause waker releases it, in fair order, once no pause matches what it was
    held for. It takes no room in its user's dispatch window while the row exists."""

    __tablename__ = "ai_pause_hold"
    __table_args__ = (Index("ix_ai_pause_hold_user_turn", "user_id", "turn"),)

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[str] = mapped_column(String(128))
    workflow_id: Mapped[str] = mapped_column(String(255))
    # What the call was held for: the pause waker releases it once no pause matches these.
    job_type: Mapped[str] = mapped_column(String(64))
    provider: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(200))
    # Its place in the fair release order, fixed when it was held: one after its user's last
    # held job, or (its user has none) the lowest turn held, the one being released now.
    turn: Mapped[int] = mapped_column(BigInteger)
    held_at: Mapped[datetime] = mapped_column(TS, server_default=sql("clock_timestamp()"))


class AiResumePace(Base):
    """One row: the next free slot of the release of held jobs, shared by every process
    (AI_RESUME_RATE slots a second)."""

    __tablename__ = "ai_resume_pace"

    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    next_at: Mapped[datetime] = mapped_column(TS)
