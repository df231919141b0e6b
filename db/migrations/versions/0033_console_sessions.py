"""console sessions: the operator console's signed-in admins

`console_session`: one row per sign-in to the console (/console), keyed by the SHA-256 (hex) of
the session id the browser holds in its cookie: the id itself is never stored, so a read of the
table cannot be replayed as a cookie. `expires_at` is the sign-in plus CONSOLE_SESSION_TTL_S,
never past the admin token's `exp`; a sign-in deletes expired rows (`ix_console_session_expires`),
a sign-out its own row.

Revision ID: 0033
Revises: 0032
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0033"
down_revision: str | None = '0032'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "console_session",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("created_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_console_session")),
    )
    op.create_index("ix_console_session_expires", "console_session", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_console_session_expires", table_name="console_session")
    op.drop_table("console_session")
