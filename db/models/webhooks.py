"""SQLAlchemy models of the signed webhooks: a user's endpoints and their deliveries.

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
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import TS, Base, encrypted


class WebhookEndpoint(Base):
    """A user's webhook receiver. The signing secret is stored encrypted (AES-GCM, AAD bound to
    the row id); after a rotation the previous one keeps signing until `previous_valid_until`."""

    __tablename__ = "webhook_endpoint"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128), index=True)
    url: Mapped[str] = mapped_column(Text)
    event_types: Mapped[list[str]] = mapped_column(JSONB)
    key_id: Mapped[str] = mapped_column(String(64))
    secret_ciphertext: Mapped[bytes] = mapped_column(LargeBinary, info=encrypted(key_id="key_id"))
    previous_key_id: Mapped[str | None] = mapped_column(String(64))
    previous_secret_ciphertext: Mapped[bytes | None] = mapped_column(
        LargeBinary, info=encrypted(key_id="previous_key_id")
    )
    previous_valid_until: Mapped[datetime | None] = mapped_column(TS)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    deleted_at: Mapped[datetime | None] = mapped_column(TS)


class WebhookDelivery(Base):
    """One outbox domain event for one endpoint; `webhook_id` is stable across its retries."""

    __tablename__ = "webhook_delivery"
    __table_args__ = (
        UniqueConstraint("endpoint_id", "event_id"),
        CheckConstraint("status IN ('pending','delivered','failed','dead')", name="status"),
        Index(
            "ix_webhook_delivery_due",
            "next_attempt_at",
            postgresql_where=text("status IN ('pending','failed')"),
        ),
        # The fair claim walks the owners of due rows, then each owner's rows in due order.
        Index(
            "ix_webhook_delivery_user_due",
            "user_id",
            "next_attempt_at",
            postgresql_where=text("status IN ('pending','failed')"),
        ),
        # The retention purge deletes finished rows oldest first, in bounded batches.
        Index(
            "ix_webhook_delivery_finished",
            "finished_at",
            postgresql_where=text("status IN ('delivered','dead')"),
        ),
        Index("ix_webhook_delivery_status", "status", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    endpoint_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("webhook_endpoint.id", ondelete="CASCADE")
    )
    # The endpoint owner's, copied at fan-out: fairness is per user.
    user_id: Mapped[str] = mapped_column(String(128))
    # The outbox event id; no foreign key: published outbox rows are deleted by retention.
    event_id: Mapped[int] = mapped_column(BigInteger)
    job_id: Mapped[str] = mapped_column(String(64))
    webhook_id: Mapped[str] = mapped_column(String(128))
    event_type: Mapped[str] = mapped_column(String(64))
    occurred_at: Mapped[datetime] = mapped_column(TS)
    status: Mapped[str] = mapped_column(String(16), server_default=text("'pending'"))
    attempt_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    next_attempt_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    # The claim's lease end while a deliverer holds it (equal to `next_attempt_at` then):
    # a user's in-flight share is counted from it across deliverers (db/webhook_deliveries.py).
    claimed_until: Mapped[datetime | None] = mapped_column(TS)
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    replayed_at: Mapped[datetime | None] = mapped_column(TS)
    delivered_at: Mapped[datetime | None] = mapped_column(TS)
    # When it became delivered or dead (NULL otherwise); retention counts from here.
    finished_at: Mapped[datetime | None] = mapped_column(TS)
