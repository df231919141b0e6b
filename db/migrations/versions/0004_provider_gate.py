"""provider_gate: a shared pause and circuit breaker per AI provider

Revision ID: 0004
Revises: 0003
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'provider_gate',
        sa.Column('provider', sa.String(length=64), nullable=False),
        sa.Column('paused_until', sa.DateTime(timezone=True), nullable=True),
        sa.Column('consecutive_failures', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('open_until', sa.DateTime(timezone=True), nullable=True),
        sa.Column('probe_until', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('provider', name=op.f('pk_provider_gate')),
    )


def downgrade() -> None:
    op.drop_table('provider_gate')
