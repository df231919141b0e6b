"""long sources: a job's chunks, and the chunk of each usage row

- `ai_job_chunk`: one row per chunk of a long source (its character range, the items it is
  asked for, its attempts, its validated output once it succeeded), written at create.
- `ai_job.chunk_count`: how many chunks the job was planned with (NULL: one call per attempt).
- `ai_usage_log.chunk_no`: which chunk a call was made for (NULL for one-call jobs).

Revision ID: 0014
Revises: 0013
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0014'
down_revision: str | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('ai_job', sa.Column('chunk_count', sa.Integer(), nullable=True))
    op.add_column('ai_usage_log', sa.Column('chunk_no', sa.Integer(), nullable=True))
    op.create_table(
        'ai_job_chunk',
        sa.Column('job_id', postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column('chunk_no', sa.Integer(), nullable=False),
        sa.Column('start_char', sa.Integer(), nullable=False),
        sa.Column('end_char', sa.Integer(), nullable=False),
        sa.Column('input_tokens', sa.Integer(), nullable=False),
        sa.Column('item_count', sa.Integer(), nullable=False),
        sa.Column('status', sa.String(length=16), server_default=sa.text("'pending'"), nullable=False),
        sa.Column('attempt_count', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('output', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column('output_hash', sa.String(length=64), nullable=True),
        sa.Column('error_code', sa.String(length=64), nullable=True),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            'created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ['job_id'],
            ['ai_job.id'],
            name=op.f('fk_ai_job_chunk_job_id_ai_job'),
            ondelete='CASCADE',
        ),
        sa.PrimaryKeyConstraint('job_id', 'chunk_no', name=op.f('pk_ai_job_chunk')),
    )


def downgrade() -> None:
    op.drop_table('ai_job_chunk')
    op.drop_column('ai_usage_log', 'chunk_no')
    op.drop_column('ai_job', 'chunk_count')
