"""stream items: the items of an answer that is still being written

`ai_job_stream_item`: one row per item of a one-call job's list (a quiz's question, a deck's
card) that became complete and valid while the provider was still streaming its answer, keyed
by (job, attempt, ordinal) so that a retry's items never mix with a failed attempt's.
`retracted_at` is set when the final validation rejected the item, or when its attempt failed
(its retry's items replace it); rows are never deleted before the job is (CASCADE). `version`
is the time the row was written (or retracted), the id of its event on the job's stream.

Revision ID: 0024
Revises: 0022
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0024'
down_revision: str | None = '0022'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'ai_job_stream_item',
        sa.Column('job_id', sa.Uuid(), nullable=False),
        sa.Column('attempt_no', sa.Integer(), nullable=False),
        sa.Column('ordinal', sa.Integer(), nullable=False),
        sa.Column('content', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            'created_at',
            sa.DateTime(timezone=True),
            server_default=sa.text('clock_timestamp()'),
            nullable=False,
        ),
        sa.Column('retracted_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ['job_id'], ['ai_job.id'], name=op.f('fk_ai_job_stream_item_job_id_ai_job'),
            ondelete='CASCADE',
        ),
        sa.PrimaryKeyConstraint(
            'job_id', 'attempt_no', 'ordinal', name=op.f('pk_ai_job_stream_item')
        ),
    )


def downgrade() -> None:
    op.drop_table('ai_job_stream_item')
