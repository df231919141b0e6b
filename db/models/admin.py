"""SQLAlchemy models of the operators' tables: the admin audit and bulk operations.

The Alembic migrations are the schema; a test keeps the two equal. Base is db/models/base.py's.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import TS, Base


class AdminAudit(Base):
    """One admin action (or view of internals): who, what, which target, how it ended. Written
    in the transaction of the action; `detail` holds ids, filters and counts, never job input,
    output, prompts or keys. Deleted after RETENTION_DAYS' `admin_audit` days."""

    __tablename__ = "admin_audit"
    __table_args__ = (
        Index("ix_admin_audit_created", "created_at"),
        Index("ix_admin_audit_actor", "actor", "id"),
        Index("ix_admin_audit_action", "action", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    target_type: Mapped[str] = mapped_column(String(32))
    target_id: Mapped[str | None] = mapped_column(String(128))
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    outcome: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())


class BulkOperation(Base):
    """A bulk cancel or retry: its filter and the number of jobs it froze at submission."""

    __tablename__ = "bulk_operation"
    __table_args__ = (
        CheckConstraint("action IN ('cancel','retry')", name="action"),
        CheckConstraint("status IN ('running','completed')", name="status"),
        UniqueConstraint("actor", "idempotency_key"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    action: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(128))
    filter: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16), server_default=text("'running'"))
    matched: Mapped[int] = mapped_column(Integer)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    workflow_id: Mapped[str] = mapped_column(String(255))
    workflow_started_at: Mapped[datetime | None] = mapped_column(TS)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(TS)
    # A bulk retry whose retries skip the owners' quotas and budgets (the admin's override).
    override_budget: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))


class BulkOperationItem(Base):
    """One matched job of a bulk operation. `state` leaves `pending` once, by a CAS in the
    transaction that acts on the job: a retried activity finds it done and moves on."""

    __tablename__ = "bulk_operation_item"
    __table_args__ = (
        CheckConstraint("state IN ('pending','done','skipped','failed','refused')", name="state"),
        Index(
            "ix_bulk_operation_item_pending",
            "operation_id",
            "ordinal",
            postgresql_where=text("state = 'pending'"),
        ),
        Index("ix_bulk_operation_item_job", "job_id"),
    )

    operation_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True),
        ForeignKey("bulk_operation.id", ondelete="CASCADE"),
        primary_key=True,
    )
    ordinal: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE")
    )
    state: Mapped[str] = mapped_column(String(16), server_default=text("'pending'"))
    reason: Mapped[str | None] = mapped_column(String(64))
    result_job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    updated_at: Mapped[datetime | None] = mapped_column(TS)
