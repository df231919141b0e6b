"""correction hint for retried prompts; every list filter served by an index

Revision ID: 0003
Revises: 0002
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Lists are newest first on (created_at, id) with one optional equality filter (or a user's
# own jobs with one): an index per filter makes a page cost independent of the table's size.
LIST_INDEXES = {
    'ix_ai_job_user_status_created': ['user_id', 'lifecycle_status', 'created_at', 'id'],
    'ix_ai_job_user_type_created': ['user_id', 'job_type', 'created_at', 'id'],
    'ix_ai_job_status_created': ['lifecycle_status', 'created_at', 'id'],
    'ix_ai_job_type_created': ['job_type', 'created_at', 'id'],
    'ix_ai_job_queue_created': ['queue_name', 'created_at', 'id'],
}


def upgrade() -> None:
    op.add_column('ai_job', sa.Column('correction_hint', sa.Text(), nullable=True))
    for name, cols in LIST_INDEXES.items():
        op.create_index(name, 'ai_job', cols, unique=False)
    # Published rows are removed after the retention period (the reconciler).
    op.create_index(
        'ix_outbox_event_published', 'outbox_event', ['published_at'], unique=False,
        postgresql_where=sa.text("status = 'published'"),
    )


def downgrade() -> None:
    op.drop_index('ix_outbox_event_published', table_name='outbox_event', postgresql_where=sa.text("status = 'published'"))
    for name in LIST_INDEXES:
        op.drop_index(name, table_name='ai_job')
    op.drop_column('ai_job', 'correction_hint')
