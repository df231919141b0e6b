"""SQLAlchemy models of the batch tier: a batch (one JSONL file at the provider, one Temporal
workflow `ai-batch:{id}`) and its items (one job's attempt each). db/batches.py reads and writes
them.

Imported by db/models/__init__.py so that `Base.metadata` holds every table; the migrations
`0027_batches` and `0032_batch_caps_and_files` are the schema, a test keeps the two equal. An
item's `body` (the request) and `response` (the chat completion) are job content: private like
the snapshot, never logged and never in Temporal.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import TS, Base

BATCH_STATUS_SQL = "'open','submitting','submitted','completed','failed','expired','cancelled'"
ITEM_STATUS_SQL = "'pending','submitted','succeeded','failed','cancelled'"
FILE_ROLE_SQL = "'input','output','error','orphan'"
# An item whose outcome is not recorded yet: should its job end meanwhile (it left a closed
# batch), it holds the job's reservation open until then (db/budgets.py).
HELD_ITEM_SQL = "ended_at IS NULL"


class AiBatch(Base):
    """One batch of one (provider, model, key, task queue): `open` while it gathers items (one
    open batch per group), `submitting` once its window closed, `submitted` once the provider
    has it, then ended (`completed`, `failed`, `expired`, `cancelled`)."""

    __tablename__ = "ai_batch"
    __table_args__ = (
        CheckConstraint(f"status IN ({BATCH_STATUS_SQL})", name="status"),
        Index(
            "ux_ai_batch_open",
            "provider",
            "model",
            "key_ref",
            "task_queue",
            unique=True,
            postgresql_where=text("status = 'open'"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    provider: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    key_ref: Mapped[str] = mapped_column(String(128))
    task_queue: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), server_default=text("'open'"))
    provider_batch_id: Mapped[str | None] = mapped_column(String(128))
    input_file_id: Mapped[str | None] = mapped_column(String(128))
    output_file_id: Mapped[str | None] = mapped_column(String(128))
    error_file_id: Mapped[str | None] = mapped_column(String(128))
    workflow_id: Mapped[str] = mapped_column(String(200))
    item_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # The JSONL bytes of its enrolled lines (AI_BATCH_MAX_BYTES is checked against it).
    byte_count: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    # When its first upload began: from then on its file's lines are fixed, and a retried
    # submit looks for what an earlier attempt made at the provider first.
    upload_started_at: Mapped[datetime | None] = mapped_column(TS)
    submitted_at: Mapped[datetime | None] = mapped_column(TS)
    ended_at: Mapped[datetime | None] = mapped_column(TS)


class AiBatchItem(Base):
    """One job's attempt in a batch (`custom_id` `job-{job_id}-a{attempt}`): `pending` until
    its batch is submitted, then `submitted`, then `succeeded` (its `response` stored) or
    `failed` (`error_code`); `cancelled` when its job left. `ended_at` is set once its outcome
    is recorded (or it left before submission): the guard that charges an answer once."""

    __tablename__ = "ai_batch_item"
    __table_args__ = (
        CheckConstraint(f"status IN ({ITEM_STATUS_SQL})", name="status"),
        Index("ix_ai_batch_item_batch_status", "batch_id", "status"),
        Index("ix_ai_batch_item_job_attempt", "job_id", "attempt"),
        Index("ix_ai_batch_item_held", "job_id", postgresql_where=text(HELD_ITEM_SQL)),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    batch_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_batch.id", ondelete="CASCADE")
    )
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE")
    )
    attempt: Mapped[int] = mapped_column(Integer)
    custom_id: Mapped[str] = mapped_column(String(128), unique=True)
    status: Mapped[str] = mapped_column(String(16), server_default=text("'pending'"))
    body: Mapped[dict[str, Any]] = mapped_column(JSONB)
    response: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    error_code: Mapped[str | None] = mapped_column(String(64))
    line_bytes: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    ended_at: Mapped[datetime | None] = mapped_column(TS)


class AiBatchFile(Base):
    """A file at the provider that belongs to a batch: its `input`, `output` or `error` file, or
    an `orphan` (an upload no batch uses, found by a retried submit). Kept until it is deleted
    there (`deleted_at`); a failed delete is tried again at `next_try_at`."""

    __tablename__ = "ai_batch_file"
    __table_args__ = (
        CheckConstraint(f"role IN ({FILE_ROLE_SQL})", name="role"),
        Index(
            "ix_ai_batch_file_undeleted", "next_try_at", postgresql_where=text("deleted_at IS NULL")
        ),
    )

    batch_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_batch.id", ondelete="CASCADE"), primary_key=True
    )
    file_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    deleted_at: Mapped[datetime | None] = mapped_column(TS)
    delete_attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    next_try_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
