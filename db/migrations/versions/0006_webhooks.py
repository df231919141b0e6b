"""webhook_endpoint and webhook_delivery: signed webhooks delivered from the outbox

Revision ID: 0006
Revises: 0005
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'webhook_endpoint',
        sa.Column('id', sa.UUID(), nullable=False),
        sa.Column('user_id', sa.String(length=128), nullable=False),
        sa.Column('url', sa.Text(), nullable=False),
        sa.Column('event_types', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column('key_id', sa.String(length=64), nullable=False),
        sa.Column('secret_ciphertext', sa.LargeBinary(), nullable=False),
        sa.Column('previous_key_id', sa.String(length=64), nullable=True),
        sa.Column('previous_secret_ciphertext', sa.LargeBinary(), nullable=True),
        sa.Column('previous_valid_until', sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            'created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
            nullable=False,
        ),
        sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_endpoint')),
    )
    op.create_index(
        op.f('ix_webhook_endpoint_user_id'), 'webhook_endpoint', ['user_id'], unique=False
    )
    op.create_table(
        'webhook_delivery',
        sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column('endpoint_id', sa.UUID(), nullable=False),
        sa.Column('event_id', sa.BigInteger(), nullable=False),
        sa.Column('job_id', sa.String(length=64), nullable=False),
        sa.Column('webhook_id', sa.String(length=128), nullable=False),
        sa.Column('event_type', sa.String(length=64), nullable=False),
        sa.Column('occurred_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            'status', sa.String(length=16), server_default=sa.text("'pending'"), nullable=False
        ),
        sa.Column('attempt_count', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column(
            'next_attempt_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
            nullable=False,
        ),
        sa.Column('last_status_code', sa.Integer(), nullable=True),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.Column(
            'created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
            nullable=False,
        ),
        sa.Column('replayed_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending','delivered','failed','dead')",
            name=op.f('ck_webhook_delivery_status'),
        ),
        sa.ForeignKeyConstraint(
            ['endpoint_id'], ['webhook_endpoint.id'],
            name=op.f('fk_webhook_delivery_endpoint_id_webhook_endpoint'), ondelete='CASCADE',
        ),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_delivery')),
        sa.UniqueConstraint(
            'endpoint_id', 'event_id', name=op.f('uq_webhook_delivery_endpoint_id_event_id')
        ),
    )
    # The deliverer's claim: due rows only.
    op.create_index(
        'ix_webhook_delivery_due', 'webhook_delivery', ['next_attempt_at'], unique=False,
        postgresql_where=sa.text("status IN ('pending','failed')"),
    )
    op.create_index(
        op.f('ix_webhook_delivery_status'), 'webhook_delivery', ['status', 'id'], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f('ix_webhook_delivery_status'), table_name='webhook_delivery')
    op.drop_index('ix_webhook_delivery_due', table_name='webhook_delivery')
    op.drop_table('webhook_delivery')
    op.drop_index(op.f('ix_webhook_endpoint_user_id'), table_name='webhook_endpoint')
    op.drop_table('webhook_endpoint')
