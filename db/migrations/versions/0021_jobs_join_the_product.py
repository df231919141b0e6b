"""jobs join the product: a client's own metadata on a job, and a job that runs later

- `ai_job.metadata`: the client's own references (at most 16 string keys and string values,
  checked by the API), `{}` when none were given; a GIN index (`jsonb_path_ops`) serves the
  list filter `metadata.<key>=<value>`, which is a containment test (`metadata @> ...`).
- `ix_ai_job_user_target_created`: a user's jobs about one target (`targetType`, `targetId`),
  newest first, as the other list filters have their (user_id, filter, created_at, id) index.
- `ai_job.run_at`: when a delayed job may start (NULL: at once). The job's workflow waits
  for it on a durable timer; the column is what the views show.

Revision ID: 0021
Revises: 0020
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0021'
down_revision: str | None = '0020'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        'ai_job',
        sa.Column(
            'metadata',
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
    )
    op.add_column('ai_job', sa.Column('run_at', sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        'ix_ai_job_metadata',
        'ai_job',
        ['metadata'],
        unique=False,
        postgresql_using='gin',
        postgresql_ops={'metadata': 'jsonb_path_ops'},
    )
    op.create_index(
        'ix_ai_job_user_target_created',
        'ai_job',
        ['user_id', 'target_type', 'target_id', 'created_at', 'id'],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index('ix_ai_job_user_target_created', table_name='ai_job')
    op.drop_index('ix_ai_job_metadata', table_name='ai_job')
    op.drop_column('ai_job', 'run_at')
    op.drop_column('ai_job', 'metadata')
