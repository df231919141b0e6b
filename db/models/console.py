"""SQLAlchemy model of the operator console's sessions (api/console/).

The Alembic migrations are the schema; a test keeps the two equal. Base is db/models/base.py's.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, String, func
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import TS, Base


class ConsoleSession(Base):
    """A signed-in admin of the console. Keyed by the SHA-256 (hex) of the cookie's session id,
    never the id: a read of this table gives nothing a browser could present. Valid until
    `expires_at` (CONSOLE_SESSION_TTL_S after the sign-in, never past the token's `exp`)."""

    __tablename__ = "console_session"
    __table_args__ = (Index("ix_console_session_expires", "expires_at"),)

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(TS)
