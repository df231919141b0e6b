"""SQLAlchemy models of the business tables the job types' projectors write: one row per
(job, ordinal).

The Alembic migrations are the schema; a test keeps the two equal. Base is db/models/base.py's.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String, Text, UniqueConstraint, func
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, declared_attr, mapped_column

from db.models.base import TS, Base


class SyntheticResult(Base):
    __tablename__ = "synthetic_result"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE"), unique=True
    )
    output_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())


class ProjectedRow:
    """The columns every business row a projector writes has: an id derived from (job, artifact
    type, ordinal), its job, its owner and its place in the output; one row per (job, ordinal).
    A job type's table subclasses this (or TargetedRow) and `Base`, and adds its content."""

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE")
    )
    user_id: Mapped[str] = mapped_column(String(128))
    ordinal: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())

    @declared_attr.directive
    def __table_args__(cls) -> tuple[UniqueConstraint]:
        return (UniqueConstraint("job_id", "ordinal"),)


class TargetedRow(ProjectedRow):
    """A business row that also records the job's target."""

    target_type: Mapped[str] = mapped_column(String(64))
    target_id: Mapped[str] = mapped_column(String(128))


class QuizQuestion(TargetedRow, Base):
    __tablename__ = "quiz_question"

    question: Mapped[str] = mapped_column(Text)
    choices: Mapped[list[str]] = mapped_column(JSONB)
    answer_index: Mapped[int] = mapped_column(Integer)
    explanation: Mapped[str] = mapped_column(Text)
    difficulty: Mapped[str] = mapped_column(String(16))


class Flashcard(TargetedRow, Base):
    __tablename__ = "flashcard"

    front: Mapped[str] = mapped_column(Text)
    back: Mapped[str] = mapped_column(Text)


class WeakPointCandidate(ProjectedRow, Base):
    __tablename__ = "weak_point_candidate"

    topic: Mapped[str] = mapped_column(Text)
    evidence: Mapped[list[str]] = mapped_column(JSONB)
    recommended_action: Mapped[str] = mapped_column(Text)
