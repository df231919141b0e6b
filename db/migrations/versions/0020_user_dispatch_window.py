"""user dispatch window: a user's own jobs ordered by priority before they reach Temporal

- `ai_job.dispatched_at`: when the relay claimed the job's enqueue row for dispatch (the job
  entered its user's dispatch window); NULL while the job is held in the outbox.
- `outbox_event.held_at`: when the relay's claim found an `ai.job.enqueue` row whose user's
  window was full and left it pending; NULL otherwise. Held rows are claimed only through the
  window, in their user's (priority, created_at, id) order; the others as before.
- `ix_ai_job_undispatched`: a user's held jobs in dispatch order (the window's claim).
- `ix_ai_job_user_dispatched`: a user's dispatched jobs that have not ended (the window's count).
- `ix_outbox_event_ready`: pending rows that are not held, oldest due first (the claim).
- `ix_outbox_event_held`: held rows (the sweep that closes the rows of held jobs that ended,
  e.g. cancelled while held).

Existing jobs: every active job without a pending enqueue row counts as dispatched, so work in
flight at the upgrade keeps its place; pending enqueue rows of queued jobs go through the
window.

Revision ID: 0020
Revises: 0019
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0020'
down_revision: str | None = '0019'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ENQUEUE = "'ai.job.enqueue'"


def upgrade() -> None:
    op.add_column('ai_job', sa.Column('dispatched_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('outbox_event', sa.Column('held_at', sa.DateTime(timezone=True), nullable=True))
    op.execute(
        f"""
        UPDATE ai_job j SET dispatched_at = j.created_at
        WHERE j.lifecycle_status IN ('queued', 'running')
          AND NOT EXISTS (SELECT 1 FROM outbox_event o
                          WHERE o.aggregate_id = j.id::text AND o.event_type = {_ENQUEUE}
                            AND o.status = 'pending')
        """
    )
    op.create_index(
        'ix_ai_job_undispatched',
        'ai_job',
        ['user_id', 'priority', 'created_at', 'id'],
        postgresql_where=sa.text("dispatched_at IS NULL AND lifecycle_status = 'queued'"),
    )
    op.create_index(
        'ix_ai_job_user_dispatched',
        'ai_job',
        ['user_id'],
        postgresql_where=sa.text(
            "dispatched_at IS NOT NULL AND lifecycle_status IN ('queued', 'running')"
        ),
    )
    op.create_index(
        'ix_outbox_event_ready',
        'outbox_event',
        ['available_at', 'id'],
        postgresql_where=sa.text("status = 'pending' AND held_at IS NULL"),
    )
    op.create_index(
        'ix_outbox_event_held',
        'outbox_event',
        ['id'],
        postgresql_where=sa.text("status = 'pending' AND held_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index('ix_outbox_event_held', table_name='outbox_event')
    op.drop_index('ix_outbox_event_ready', table_name='outbox_event')
    op.drop_index('ix_ai_job_user_dispatched', table_name='ai_job')
    op.drop_index('ix_ai_job_undispatched', table_name='ai_job')
    op.drop_column('outbox_event', 'held_at')
    op.drop_column('ai_job', 'dispatched_at')
