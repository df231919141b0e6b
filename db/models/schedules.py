"""SQLAlchemy models of recurring jobs: the schedule (the source of truth for its owner, input
and spec) and its recorded runs. What Temporal must be told about a schedule goes through the
job outbox (`outbox_event`, events `ai.schedule.sync` and `ai.schedule.trigger`).

Imported by db/models/__init__.py so that `Base.metadata` holds every table; the migrations
`0015_schedules` and `0031_schedule_events_in_the_outbox` are the schema, a test keeps the two
equal.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    Boolean,
    ForeignKey,
    Index,
    Integer,
    Numeric,
    String,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import TS, Base


class AiSchedule(Base):
    __tablename__ = "ai_schedule"
    __table_args__ = (Index("ix_ai_schedule_user_created", "user_id", "created_at", "id"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128))
    job_type: Mapped[str] = mapped_column(String(64))
    target_type: Mapped[str] = mapped_column(String(64))
    target_id: Mapped[str] = mapped_column(String(128))
    input: Mapped[dict[str, Any]] = mapped_column(JSONB)
    # Passed to each run's create as a job's create takes them (None: the job type's default).
    priority: Mapped[int | None] = mapped_column(Integer)
    credential_mode: Mapped[str | None] = mapped_column(String(32))
    max_cost_usd: Mapped[Decimal | None] = mapped_column(Numeric(18, 8))
    interval_s: Mapped[int | None] = mapped_column(Integer)
    cron: Mapped[str | None] = mapped_column(String(128))
    timezone: Mapped[str] = mapped_column(String(64), server_default=text("'UTC'"))
    overlap: Mapped[str] = mapped_column(String(16), server_default=text("'skip'"))
    start_at: Mapped[datetime | None] = mapped_column(TS)
    end_at: Mapped[datetime | None] = mapped_column(TS)
    paused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    # The organisation and teams of the token that created it and its template's tags: every
    # run's job carries them (db/models/budgets.py).
    org_id: Mapped[str | None] = mapped_column(String(64))
    team_ids: Mapped[list[str]] = mapped_column(
        ARRAY(String(64)), server_default=text("'{}'::varchar[]")
    )
    tags: Mapped[list[str]] = mapped_column(
        ARRAY(String(64)), server_default=text("'{}'::varchar[]")
    )
    # Each run's job's start-by TTL in seconds, from its create (None: the defaults; 0: none).
    ttl_s: Mapped[int | None] = mapped_column(Integer)


class AiScheduleRun(Base):
    """One row per run (a fire or a trigger): the job it created, or the create's error code.
    Deleted by the retention pass DATA_RETENTION_DAYS after `created_at`."""

    __tablename__ = "ai_schedule_run"
    __table_args__ = (Index("ix_ai_schedule_run_created", "created_at"),)

    schedule_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_schedule.id", ondelete="CASCADE"), primary_key=True
    )
    scheduled_at: Mapped[datetime] = mapped_column(TS, primary_key=True)
    job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    error_code: Mapped[str | None] = mapped_column(String(64))
    manual: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
