"""every call charged: how a usage row was priced, and its cached and reasoning tokens

- `ai_usage_log.cost_basis`: 'reported' (the provider's usage) or 'estimated' (the engine
  bounded a call whose answer it did not read to the end: the prompt with its margin plus the
  tokens received, or the whole answer budget).
- `ai_usage_log.priced_as`: the model whose price the row was charged at (the canonical id of
  the echo when the table knows it, else the requested model); NULL on older rows.
- `ai_usage_log.cached_input_tokens`, `.reasoning_tokens`: the parts of `tokens_in` served from
  the provider's cache and of `tokens_out` spent reasoning.
- `ai_usage_daily.estimated_cost_usd`: the estimated rows' share of `cost_usd`.

Revision ID: 0017
Revises: 0016
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0017'
down_revision: str | None = '0016'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        'ai_usage_log',
        sa.Column(
            'cost_basis', sa.String(length=16), server_default=sa.text("'reported'"), nullable=False
        ),
    )
    op.add_column('ai_usage_log', sa.Column('priced_as', sa.String(length=128), nullable=True))
    op.add_column(
        'ai_usage_log',
        sa.Column('cached_input_tokens', sa.Integer(), server_default=sa.text('0'), nullable=False),
    )
    op.add_column(
        'ai_usage_log',
        sa.Column('reasoning_tokens', sa.Integer(), server_default=sa.text('0'), nullable=False),
    )
    op.create_check_constraint(
        op.f('ck_ai_usage_log_cost_basis'),
        'ai_usage_log',
        "cost_basis IN ('reported','estimated')",
    )
    op.add_column(
        'ai_usage_daily',
        sa.Column(
            'estimated_cost_usd',
            sa.Numeric(20, 8),
            server_default=sa.text('0'),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column('ai_usage_daily', 'estimated_cost_usd')
    op.drop_constraint(op.f('ck_ai_usage_log_cost_basis'), 'ai_usage_log', type_='check')
    op.drop_column('ai_usage_log', 'reasoning_tokens')
    op.drop_column('ai_usage_log', 'cached_input_tokens')
    op.drop_column('ai_usage_log', 'priced_as')
    op.drop_column('ai_usage_log', 'cost_basis')
