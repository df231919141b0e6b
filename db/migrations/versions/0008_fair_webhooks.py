"""webhooks: fair claims across users and retention

`webhook_delivery.user_id` (the endpoint owner's, copied at fan-out) lets the deliverer claim
round-robin per user from one index; `finished_at` (set when a row becomes delivered or dead)
lets the retention purge delete finished rows in bounded batches from one index.

Revision ID: 0008
Revises: 0007
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('webhook_delivery', sa.Column('user_id', sa.String(length=128), nullable=True))
    op.execute(
        "UPDATE webhook_delivery d SET user_id = e.user_id "
        "FROM webhook_endpoint e WHERE e.id = d.endpoint_id"
    )
    op.alter_column('webhook_delivery', 'user_id', nullable=False)
    op.add_column(
        'webhook_delivery', sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True)
    )
    # Rows finished before this revision: a delivered one at its delivery; a dead one keeps a
    # full retention period from now (when it died is not recorded).
    op.execute(
        "UPDATE webhook_delivery SET finished_at = coalesce(delivered_at, now()) "
        "WHERE status IN ('delivered', 'dead')"
    )
    # The fair claim: per user, the due rows in due order.
    op.create_index(
        'ix_webhook_delivery_user_due', 'webhook_delivery', ['user_id', 'next_attempt_at'],
        unique=False, postgresql_where=sa.text("status IN ('pending','failed')"),
    )
    # The retention purge: finished rows, oldest first.
    op.create_index(
        'ix_webhook_delivery_finished', 'webhook_delivery', ['finished_at'], unique=False,
        postgresql_where=sa.text("status IN ('delivered','dead')"),
    )


def downgrade() -> None:
    op.drop_index('ix_webhook_delivery_finished', table_name='webhook_delivery')
    op.drop_index('ix_webhook_delivery_user_due', table_name='webhook_delivery')
    op.drop_column('webhook_delivery', 'finished_at')
    op.drop_column('webhook_delivery', 'user_id')
