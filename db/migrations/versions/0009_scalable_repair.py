"""reconciler: indexes behind bounded repair passes

Revision ID: 0009
Revises: 0008
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Revival pages through the parked enqueue rows alone, in id order (a keyset cursor), however
    # many parked rows of other event types or published rows the outbox holds.
    op.create_index(
        'ix_outbox_event_parked_enqueue',
        'outbox_event',
        ['id'],
        unique=False,
        postgresql_where=sa.text("event_type = 'ai.job.enqueue' AND status IN ('dead','failed')"),
    )


def downgrade() -> None:
    op.drop_index(
        'ix_outbox_event_parked_enqueue',
        table_name='outbox_event',
        postgresql_where=sa.text("event_type = 'ai.job.enqueue' AND status IN ('dead','failed')"),
    )
