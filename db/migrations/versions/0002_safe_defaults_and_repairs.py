"""retention, pinned credentials, retry dedupe, outbox revival, lock owned by workflow id

Revision ID: 0002
Revises: 0001
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TERMINAL = "lifecycle_status IN ('succeeded','failed','cancelled')"


def upgrade() -> None:
    # One retention rule: a terminal job's input and output are removed once they are older
    # than the retention period; the column says when that happened.
    op.add_column('ai_job', sa.Column('private_data_purged_at', sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        'ix_ai_job_retention', 'ai_job', ['created_at'], unique=False,
        postgresql_where=sa.text(f"private_data_purged_at IS NULL AND {TERMINAL}"),
    )
    # One admin retry per original job, whatever idempotency keys a user picked.
    op.create_index(
        'ux_ai_job_retried_from', 'ai_job', ['retried_from_job_id'], unique=True,
        postgresql_where=sa.text('retried_from_job_id IS NOT NULL'),
    )
    # The reconciler revives enqueue rows of jobs that still wait, with a capped backoff.
    op.add_column('outbox_event', sa.Column('revive_count', sa.Integer(), server_default=sa.text('0'), nullable=False))
    op.create_index(
        'ix_outbox_event_stalled', 'outbox_event', ['status', 'id'], unique=False,
        postgresql_where=sa.text("status IN ('dead','failed')"),
    )
    # Lock ownership moves from the run id to the workflow id (stable across a Temporal Reset):
    # locks held by running jobs keep working under the new rule.
    op.execute(
        "UPDATE ai_job SET locked_by = left(workflow_id || '/' || locked_by, 255) "
        "WHERE lifecycle_status = 'running' AND locked_by IS NOT NULL"
    )


def downgrade() -> None:
    op.drop_index('ix_outbox_event_stalled', table_name='outbox_event', postgresql_where=sa.text("status IN ('dead','failed')"))
    op.drop_column('outbox_event', 'revive_count')
    op.drop_index('ux_ai_job_retried_from', table_name='ai_job', postgresql_where=sa.text('retried_from_job_id IS NOT NULL'))
    op.drop_index('ix_ai_job_retention', table_name='ai_job', postgresql_where=sa.text(f"private_data_purged_at IS NULL AND {TERMINAL}"))
    op.drop_column('ai_job', 'private_data_purged_at')
