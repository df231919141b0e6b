"""provider_gate: one pause, breaker and probe per (provider, key)

The gate was one row per provider name, so a user key's 429 paused the platform key and one
user's failing key could open the breaker for everyone. Existing rows are the platform key's.

Revision ID: 0007
Revises: 0006
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        'provider_gate',
        sa.Column('key_ref', sa.String(length=80), server_default='platform', nullable=False),
    )
    op.drop_constraint('pk_provider_gate', 'provider_gate', type_='primary')
    op.create_primary_key('pk_provider_gate', 'provider_gate', ['provider', 'key_ref'])


def downgrade() -> None:
    op.execute("DELETE FROM provider_gate WHERE key_ref <> 'platform'")
    op.drop_constraint('pk_provider_gate', 'provider_gate', type_='primary')
    op.create_primary_key('pk_provider_gate', 'provider_gate', ['provider'])
    op.drop_column('provider_gate', 'key_ref')
