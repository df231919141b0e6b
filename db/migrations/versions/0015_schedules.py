"""schedules: recurring jobs on Temporal Schedules

- `ai_schedule`: a user's schedule (job type, target, input, interval or cron in a time zone,
  overlap policy, window, paused): the source of truth for its owner and input.
- `ai_schedule_run`: one row per run, the job it created or the create's error code.
- `ai_schedule_command`: the schedule's outbox, what Temporal must be told (sync, trigger),
  written in the transaction that changes the schedule and dispatched idempotently.

Revision ID: 0015
Revises: 0014
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0015'
down_revision: str | None = '0014'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        'ai_schedule',
        sa.Column('id', postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column('user_id', sa.String(length=128), nullable=False),
        sa.Column('job_type', sa.String(length=64), nullable=False),
        sa.Column('target_type', sa.String(length=64), nullable=False),
        sa.Column('target_id', sa.String(length=128), nullable=False),
        sa.Column('input', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column('priority', sa.Integer(), nullable=True),
        sa.Column('credential_mode', sa.String(length=32), nullable=True),
        sa.Column('max_cost_usd', sa.Numeric(precision=18, scale=8), nullable=True),
        sa.Column('interval_s', sa.Integer(), nullable=True),
        sa.Column('cron', sa.String(length=128), nullable=True),
        sa.Column('timezone', sa.String(length=64), server_default=sa.text("'UTC'"), nullable=False),
        sa.Column('overlap', sa.String(length=16), server_default=sa.text("'skip'"), nullable=False),
        sa.Column('start_at', _TS, nullable=True),
        sa.Column('end_at', _TS, nullable=True),
        sa.Column('paused', sa.Boolean(), server_default=sa.text('false'), nullable=False),
        sa.Column('created_at', _TS, server_default=sa.func.now(), nullable=False),
        sa.Column('updated_at', _TS, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_ai_schedule')),
    )
    op.create_index(
        'ix_ai_schedule_user_created', 'ai_schedule', ['user_id', 'created_at', 'id'], unique=False
    )
    op.create_table(
        'ai_schedule_run',
        sa.Column('schedule_id', postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column('scheduled_at', _TS, nullable=False),
        sa.Column('job_id', postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column('error_code', sa.String(length=64), nullable=True),
        sa.Column('manual', sa.Boolean(), server_default=sa.text('false'), nullable=False),
        sa.Column('created_at', _TS, server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(
            ['schedule_id'],
            ['ai_schedule.id'],
            name=op.f('fk_ai_schedule_run_schedule_id_ai_schedule'),
            ondelete='CASCADE',
        ),
        sa.PrimaryKeyConstraint('schedule_id', 'scheduled_at', name=op.f('pk_ai_schedule_run')),
    )
    op.create_table(
        'ai_schedule_command',
        sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column('schedule_id', postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column('command', sa.String(length=16), nullable=False),
        sa.Column('run_at', _TS, nullable=True),
        sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('available_at', _TS, server_default=sa.func.now(), nullable=False),
        sa.Column('locked_until', _TS, nullable=True),
        sa.Column('done_at', _TS, nullable=True),
        sa.Column('last_error', sa.String(length=300), nullable=True),
        sa.Column('created_at', _TS, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_ai_schedule_command')),
    )
    op.create_index(
        'ix_ai_schedule_command_due',
        'ai_schedule_command',
        ['available_at'],
        unique=False,
        postgresql_where=sa.text('done_at IS NULL'),
    )


def downgrade() -> None:
    op.drop_index('ix_ai_schedule_command_due', table_name='ai_schedule_command')
    op.drop_table('ai_schedule_command')
    op.drop_table('ai_schedule_run')
    op.drop_index('ix_ai_schedule_user_created', table_name='ai_schedule')
    op.drop_table('ai_schedule')
