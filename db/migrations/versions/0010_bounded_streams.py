"""event streams: an index behind the resume query

Revision ID: 0010
Revises: 0009
"""
from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The resume query of the all-jobs stream (`jobs.changed_since`): one user's jobs
    # changed after a moment, oldest change first, with a LIMIT. Without it PostgreSQL reads
    # every job of the user (ix_ai_job_user_created) and sorts them, on every reconnect.
    op.create_index('ix_ai_job_user_updated', 'ai_job', ['user_id', 'updated_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_ai_job_user_updated', table_name='ai_job')
