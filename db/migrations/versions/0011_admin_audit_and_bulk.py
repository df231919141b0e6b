"""admin: the audit log and bulk operations

Revision ID: 0011
Revises: 0010
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Who did what to which job, when, and how it ended: written in the transaction of the action
    # itself (a rolled-back action leaves no entry; a refused one gets its own entry).
    op.create_table(
        'admin_audit',
        sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column('actor', sa.String(length=128), nullable=False),
        sa.Column('action', sa.String(length=64), nullable=False),
        sa.Column('target_type', sa.String(length=32), nullable=False),
        sa.Column('target_id', sa.String(length=128), nullable=True),
        sa.Column(
            'detail', postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"), nullable=False,
        ),
        sa.Column('outcome', sa.String(length=64), nullable=False),
        sa.Column(
            'created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_admin_audit')),
    )
    # The reader pages newest first by id, optionally per actor or action; retention deletes
    # the oldest first by created_at.
    op.create_index('ix_admin_audit_created', 'admin_audit', ['created_at'], unique=False)
    op.create_index('ix_admin_audit_actor', 'admin_audit', ['actor', 'id'], unique=False)
    op.create_index('ix_admin_audit_action', 'admin_audit', ['action', 'id'], unique=False)

    op.create_table(
        'bulk_operation',
        sa.Column('id', sa.UUID(), nullable=False),
        sa.Column('action', sa.String(length=16), nullable=False),
        sa.Column('actor', sa.String(length=128), nullable=False),
        sa.Column('filter', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            'status', sa.String(length=16), server_default=sa.text("'running'"), nullable=False
        ),
        sa.Column('matched', sa.Integer(), nullable=False),
        sa.Column('idempotency_key', sa.String(length=255), nullable=True),
        sa.Column('workflow_id', sa.String(length=255), nullable=False),
        sa.Column('workflow_started_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            'created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
            nullable=False,
        ),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("action IN ('cancel','retry')", name=op.f('ck_bulk_operation_action')),
        sa.CheckConstraint(
            "status IN ('running','completed')", name=op.f('ck_bulk_operation_status')
        ),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_bulk_operation')),
        sa.UniqueConstraint(
            'actor', 'idempotency_key', name=op.f('uq_bulk_operation_actor_idempotency_key')
        ),
    )
    # One row per matched job, frozen at submission; `state` moves pending -> done | skipped |
    # failed exactly once, by a CAS in the transaction of the action on the job.
    op.create_table(
        'bulk_operation_item',
        sa.Column('operation_id', sa.UUID(), nullable=False),
        sa.Column('ordinal', sa.Integer(), nullable=False),
        sa.Column('job_id', sa.UUID(), nullable=False),
        sa.Column(
            'state', sa.String(length=16), server_default=sa.text("'pending'"), nullable=False
        ),
        sa.Column('reason', sa.String(length=64), nullable=True),
        sa.Column('result_job_id', sa.UUID(), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('pending','done','skipped','failed')",
            name=op.f('ck_bulk_operation_item_state'),
        ),
        sa.ForeignKeyConstraint(
            ['operation_id'], ['bulk_operation.id'],
            name=op.f('fk_bulk_operation_item_operation_id_bulk_operation'), ondelete='CASCADE',
        ),
        sa.ForeignKeyConstraint(
            ['job_id'], ['ai_job.id'],
            name=op.f('fk_bulk_operation_item_job_id_ai_job'), ondelete='CASCADE',
        ),
        sa.PrimaryKeyConstraint('operation_id', 'ordinal', name=op.f('pk_bulk_operation_item')),
    )
    op.create_index(
        'ix_bulk_operation_item_pending', 'bulk_operation_item', ['operation_id', 'ordinal'],
        unique=False, postgresql_where=sa.text("state = 'pending'"),
    )
    op.create_index('ix_bulk_operation_item_job', 'bulk_operation_item', ['job_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_bulk_operation_item_job', table_name='bulk_operation_item')
    op.drop_index(
        'ix_bulk_operation_item_pending', table_name='bulk_operation_item',
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.drop_table('bulk_operation_item')
    op.drop_table('bulk_operation')
    op.drop_index('ix_admin_audit_action', table_name='admin_audit')
    op.drop_index('ix_admin_audit_actor', table_name='admin_audit')
    op.drop_index('ix_admin_audit_created', table_name='admin_audit')
    op.drop_table('admin_audit')
