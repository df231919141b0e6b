"""The tables of trusted output: structured-output downgrades, rollouts and their arms, feedback.

The Alembic migrations are the schema (0038, with the guard's trigger); a test keeps the two
equal. Base is db/models/base.py's.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from sqlalchemy import (
    CheckConstraint,
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


class AiStructuredDowngrade(Base):
    """A (base URL, model) that refused a structured-output form: the lower form it takes
    until `expires_at` (db/structured_downgrades.py)."""

    __tablename__ = "ai_structured_downgrade"
    __table_args__ = (CheckConstraint("form IN ('json_object','none')", name="form"),)

    base_url: Mapped[str] = mapped_column(String(512), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    form: Mapped[str] = mapped_column(String(16))
    expires_at: Mapped[datetime] = mapped_column(TS)
    updated_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())


class AiRollout(Base):
    """A job type's weighted rollout (db/rollouts.py): `id` is new with every PUT (its figures
    start anew), the guard's floors beside it."""

    __tablename__ = "ai_rollout"

    job_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), unique=True)
    min_samples: Mapped[int] = mapped_column(Integer)
    min_mean_feedback: Mapped[Decimal] = mapped_column(Numeric(6, 4))
    min_success_rate: Mapped[Decimal] = mapped_column(Numeric(6, 4))
    updated_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())


class AiRolloutArm(Base):
    """One arm of a rollout: its weight, its prompt version and/or model, whether the guard
    halted it (and why)."""

    __tablename__ = "ai_rollout_arm"
    __table_args__ = (
        CheckConstraint("state IN ('active','halted')", name="state"),
        CheckConstraint(
            "halted_reason IS NULL OR halted_reason IN ('feedback','success_rate')",
            name="halted_reason",
        ),
    )

    rollout_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_rollout.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    prompt_version: Mapped[str | None] = mapped_column(String(128))
    model: Mapped[str | None] = mapped_column(String(128))
    weight: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), server_default=text("'active'"))
    halted_reason: Mapped[str | None] = mapped_column(String(16))
    halted_at: Mapped[datetime | None] = mapped_column(TS)


class AiJobFeedback(Base):
    """One owner's score of one succeeded job (db/feedback.py), with the arm, prompt version and
    model the job ran on. `comment` is private data (purged with the job's)."""

    __tablename__ = "ai_job_feedback"
    __table_args__ = (
        CheckConstraint("score BETWEEN -1 AND 1", name="score"),
        Index(
            "ix_ai_job_feedback_rollout",
            "rollout_id",
            "rollout_arm",
            postgresql_where=text("rollout_id IS NOT NULL"),
        ),
    )

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    score: Mapped[Decimal] = mapped_column(Numeric(6, 4))
    item_ordinal: Mapped[int | None] = mapped_column(Integer)
    comment: Mapped[str | None] = mapped_column(Text)
    rollout_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    rollout_arm: Mapped[str | None] = mapped_column(String(64))
    prompt_version: Mapped[str] = mapped_column(String(128))
    model: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
