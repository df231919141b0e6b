"""limit waiters: the fair queue of the jobs waiting for a provider limit

- `limit_waiter`: one row per waiting call (a job, or one chunk of it: `chunk_no` -1 for a
  job's one call), per (provider, model, key_ref), with its user (the fair order's lane), its
  workflow (whom a wake-up signals), the tokens it needs, its place (`turn`, its user's
  round in the fair order, then `seq`, the order it entered), when it was last woken (`woken_at`: a wake claimed, so two waker processes never
  signal the same waiter) and when the row stops counting if nobody looks again
  (`expires_at`: a waiter whose workflow is gone never blocks the others for ever).

Revision ID: 0018
Revises: 0017
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0018'
down_revision: str | None = '0017'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'limit_waiter',
        sa.Column('job_id', postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column('chunk_no', sa.Integer(), nullable=False),
        sa.Column('provider', sa.String(length=64), nullable=False),
        sa.Column('model', sa.String(length=128), nullable=False),
        sa.Column('key_ref', sa.String(length=80), nullable=False),
        sa.Column('user_id', sa.String(length=128), nullable=False),
        sa.Column('workflow_id', sa.String(length=255), nullable=False),
        sa.Column('tokens', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('turn', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('seq', sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column('woken_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('job_id', 'chunk_no', name=op.f('pk_limit_waiter')),
    )
    op.create_index(
        'ix_limit_waiter_key', 'limit_waiter', ['provider', 'model', 'key_ref', 'seq']
    )


def downgrade() -> None:
    op.drop_index('ix_limit_waiter_key', table_name='limit_waiter')
    op.drop_table('limit_waiter')
