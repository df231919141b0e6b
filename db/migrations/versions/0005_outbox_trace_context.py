"""outbox_event.trace_context: the W3C trace context of the request that wrote the row

Revision ID: 0005
Revises: 0004
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # {"traceparent": ..., "tracestate": ...} or NULL (tracing off, or rows written before).
    # Nullable without a default: adding it rewrites nothing.
    op.add_column(
        'outbox_event',
        sa.Column('trace_context', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column('outbox_event', 'trace_context')
