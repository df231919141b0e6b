"""money that cannot leak: retries through budgets, fenced attempts, idempotent usage rows

- `bulk_operation.override_budget`: a bulk retry submitted with the admin's budget override
  (its retries skip the owners' quotas and budgets); read by the operation's activity, so the
  workflow's input (and its recorded histories) stay as they were.
- `bulk_operation_item.state` may be `refused`: a bulk retry the owner's quotas or budgets
  refused (never counted as done).
- `ai_job.call_seq`: the job's provider calls numbered, raised by each EXECUTE attempt's take.
- `ai_usage_log.call_no` and a unique index on (job, attempt, chunk, call): a call's usage row
  has one identity, so a retried write (after a commit whose answer was lost) never doubles it.
  Rows written before this have no call number and are left out of the index.

Revision ID: 0016
Revises: 0015
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0016'
down_revision: str | None = '0015'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        'bulk_operation',
        sa.Column(
            'override_budget', sa.Boolean(), server_default=sa.text('false'), nullable=False
        ),
    )
    op.drop_constraint(op.f('ck_bulk_operation_item_state'), 'bulk_operation_item', type_='check')
    op.create_check_constraint(
        op.f('ck_bulk_operation_item_state'),
        'bulk_operation_item',
        "state IN ('pending','done','skipped','failed','refused')",
    )
    op.add_column(
        'ai_job', sa.Column('call_seq', sa.Integer(), server_default=sa.text('0'), nullable=False)
    )
    op.add_column('ai_usage_log', sa.Column('call_no', sa.Integer(), nullable=True))
    op.create_index(
        'ux_ai_usage_log_call',
        'ai_usage_log',
        ['job_id', 'attempt_no', 'chunk_no', 'call_no'],
        unique=True,
        postgresql_nulls_not_distinct=True,
        postgresql_where=sa.text('call_no IS NOT NULL'),
    )


def downgrade() -> None:
    op.drop_index('ux_ai_usage_log_call', table_name='ai_usage_log')
    op.drop_column('ai_usage_log', 'call_no')
    op.drop_column('ai_job', 'call_seq')
    op.execute("UPDATE bulk_operation_item SET state = 'failed' WHERE state = 'refused'")
    op.drop_constraint(op.f('ck_bulk_operation_item_state'), 'bulk_operation_item', type_='check')
    op.create_check_constraint(
        op.f('ck_bulk_operation_item_state'),
        'bulk_operation_item',
        "state IN ('pending','done','skipped','failed')",
    )
    op.drop_column('bulk_operation', 'override_budget')
