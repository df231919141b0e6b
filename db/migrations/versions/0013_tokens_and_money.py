"""tokens and money: estimates, reservations, a daily usage rollup, limits per model and key

- `ai_job` gains what create fixes about a job's tokens and money: its estimated input tokens,
  the answer budget its calls send as `max_tokens`, the client's per-job cost cap, the cost
  reserved against the user's budgets while it is active, and what its calls have cost so far.
- `ai_usage_daily` rolls `ai_usage_log` up per UTC day, user, job type, model and credential
  mode; it is written in the usage row's transaction and backfilled here from the log.
- `provider_limit` holds the request and token buckets of each (provider, model, key), and
  `provider_call_lease` the calls in flight under a concurrency limit.

Revision ID: 0013
Revises: 0012
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0013'
down_revision: str | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('ai_job', sa.Column('estimated_input_tokens', sa.Integer(), nullable=True))
    op.add_column('ai_job', sa.Column('max_output_tokens', sa.Integer(), nullable=True))
    op.add_column('ai_job', sa.Column('max_cost_usd', sa.Numeric(18, 8), nullable=True))
    op.add_column(
        'ai_job',
        sa.Column(
            'reserved_cost_usd', sa.Numeric(18, 8), server_default=sa.text('0'), nullable=False
        ),
    )
    op.add_column(
        'ai_job',
        sa.Column('spent_cost_usd', sa.Numeric(18, 8), server_default=sa.text('0'), nullable=False),
    )
    # What earlier jobs' calls cost, so a job active across the upgrade is charged correctly.
    op.execute(
        """
        UPDATE ai_job SET spent_cost_usd = u.cost
        FROM (SELECT job_id, sum(cost_usd) AS cost FROM ai_usage_log GROUP BY job_id) u
        WHERE u.job_id = ai_job.id
        """
    )
    op.create_table(
        'ai_usage_daily',
        sa.Column('day', sa.Date(), nullable=False),
        sa.Column('user_id', sa.String(length=128), nullable=False),
        sa.Column('job_type', sa.String(length=64), nullable=False),
        sa.Column('model', sa.String(length=128), nullable=False),
        sa.Column('credential_mode', sa.String(length=32), nullable=False),
        sa.Column('calls', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('tokens_in', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('tokens_out', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('cost_usd', sa.Numeric(20, 8), server_default=sa.text('0'), nullable=False),
        sa.PrimaryKeyConstraint(
            'day', 'user_id', 'job_type', 'model', 'credential_mode', name=op.f('pk_ai_usage_daily')
        ),
    )
    op.create_index('ix_ai_usage_daily_user_day', 'ai_usage_daily', ['user_id', 'day'])
    op.execute(
        """
        INSERT INTO ai_usage_daily (day, user_id, job_type, model, credential_mode, calls,
            tokens_in, tokens_out, cost_usd)
        SELECT (u.created_at AT TIME ZONE 'UTC')::date, u.user_id, j.job_type, u.model,
               u.credential_mode, count(*), sum(u.tokens_in), sum(u.tokens_out), sum(u.cost_usd)
        FROM ai_usage_log u JOIN ai_job j ON j.id = u.job_id
        GROUP BY 1, 2, 3, 4, 5
        """
    )
    op.create_table(
        'provider_limit',
        sa.Column('provider', sa.String(length=64), nullable=False),
        sa.Column('model', sa.String(length=128), nullable=False),
        sa.Column('key_ref', sa.String(length=80), nullable=False),
        sa.Column('requests_available', sa.Float(), nullable=False),
        sa.Column('tokens_available', sa.Float(), nullable=False),
        sa.Column(
            'refilled_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column('announced_rpm', sa.Integer(), nullable=True),
        sa.Column('announced_tpm', sa.Integer(), nullable=True),
        sa.Column('blocked_until', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('provider', 'model', 'key_ref', name=op.f('pk_provider_limit')),
    )
    op.create_table(
        'provider_call_lease',
        sa.Column('id', postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column('provider', sa.String(length=64), nullable=False),
        sa.Column('model', sa.String(length=128), nullable=False),
        sa.Column('key_ref', sa.String(length=80), nullable=False),
        sa.Column('job_id', postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column('tokens', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_provider_call_lease')),
    )
    op.create_index(
        'ix_provider_call_lease_key',
        'provider_call_lease',
        ['provider', 'model', 'key_ref', 'expires_at'],
    )


def downgrade() -> None:
    op.drop_index('ix_provider_call_lease_key', table_name='provider_call_lease')
    op.drop_table('provider_call_lease')
    op.drop_table('provider_limit')
    op.drop_index('ix_ai_usage_daily_user_day', table_name='ai_usage_daily')
    op.drop_table('ai_usage_daily')
    for column in (
        'spent_cost_usd',
        'reserved_cost_usd',
        'max_cost_usd',
        'max_output_tokens',
        'estimated_input_tokens',
    ):
        op.drop_column('ai_job', column)
