"""SQLAlchemy model of a streamed answer's items (db/stream_items.py): each complete, valid item
of a one-call job's answer, written while the provider is still writing.

The Alembic migrations are the schema; a test keeps the two equal. Base is db/models/base.py's.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Integer, text
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import TS, Base


class AiJobStreamItem(Base):
    """One item of one attempt's streamed answer, by its position in the answer's list. An item
    the final validation rejects, or any item of an attempt that failed, is retracted
    (`retracted_at`), never deleted: the event streams say so. Goes with its job."""

    __tablename__ = "ai_job_stream_item"

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE"), primary_key=True
    )
    attempt_no: Mapped[int] = mapped_column(Integer, primary_key=True)
    ordinal: Mapped[int] = mapped_column(Integer, primary_key=True)
    content: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=text("clock_timestamp()"))
    retracted_at: Mapped[datetime | None] = mapped_column(TS)
