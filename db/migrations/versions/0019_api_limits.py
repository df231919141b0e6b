"""API request limits and cluster-wide caps

- `api_rate_bucket`: one token bucket per user for creates and quotes, shared by every API
  process (db/rate_limits.py).
- `cap_lease`: a per-user cap's slots held by processes (event streams), each expiring unless
  renewed, so a killed process's slots come back (db/caps.py).
- `webhook_delivery.claimed_until`: the lease end of a claim in flight, from which a user's
  in-flight share is counted across deliverers.

Revision ID: 0019
Revises: 0018
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0019'
down_revision: str | None = '0018'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'api_rate_bucket',
        sa.Column('user_id', sa.String(length=128), nullable=False),
        sa.Column('tokens', sa.Float(), nullable=False),
        sa.Column(
            'refilled_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
            nullable=False,
        ),
        sa.Column('granted', sa.Boolean(), server_default=sa.text('true'), nullable=False),
        sa.PrimaryKeyConstraint('user_id', name=op.f('pk_api_rate_bucket')),
    )
    op.create_table(
        'cap_lease',
        sa.Column('id', postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column('kind', sa.String(length=32), nullable=False),
        sa.Column('user_id', sa.String(length=128), nullable=False),
        sa.Column('holder', sa.String(length=200), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_cap_lease')),
    )
    op.create_index(
        'ix_cap_lease_user', 'cap_lease', ['kind', 'user_id', 'expires_at'], unique=False
    )
    op.add_column(
        'webhook_delivery',
        sa.Column('claimed_until', sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_column('webhook_delivery', 'claimed_until')
    op.drop_index('ix_cap_lease_user', table_name='cap_lease')
    op.drop_table('cap_lease')
    op.drop_table('api_rate_bucket')
