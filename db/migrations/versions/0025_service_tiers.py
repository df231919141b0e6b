"""service tiers: a job's tier, its off-peak deadline, and result reuse

`ai_job.service_tier` (standard, batch or offpeak: how soon and at which price its calls are
made), `offpeak_deadline_at` and `offpeak_on_deadline` (an off-peak job's deadline and what it
does when no discount window came before it), `reuse_allowed` (the create said `reuse:
"allow"`) and `reused_from_job_id` (the same user's job whose answer this one reuses; SET NULL
when that job is deleted: the copy stays the job's own).

Revision ID: 0025
Revises: 0024
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0025'
down_revision: str | None = '0024'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        'ai_job',
        sa.Column(
            'service_tier', sa.String(length=16), server_default=sa.text("'standard'"),
            nullable=False,
        ),
    )
    op.add_column(
        'ai_job', sa.Column('offpeak_deadline_at', sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column('ai_job', sa.Column('offpeak_on_deadline', sa.String(length=16), nullable=True))
    op.add_column(
        'ai_job',
        sa.Column('reuse_allowed', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    )
    op.add_column('ai_job', sa.Column('reused_from_job_id', sa.Uuid(), nullable=True))
    op.create_foreign_key(
        op.f('fk_ai_job_reused_from_job_id_ai_job'), 'ai_job', 'ai_job',
        ['reused_from_job_id'], ['id'], ondelete='SET NULL',
    )
    op.create_check_constraint(
        op.f('ck_ai_job_service_tier'), 'ai_job', "service_tier IN ('standard','batch','offpeak')"
    )
    op.create_check_constraint(
        op.f('ck_ai_job_offpeak_on_deadline'),
        'ai_job',
        "offpeak_on_deadline IS NULL OR offpeak_on_deadline IN ('standard','fail')",
    )


def downgrade() -> None:
    op.drop_constraint(op.f('ck_ai_job_offpeak_on_deadline'), 'ai_job', type_='check')
    op.drop_constraint(op.f('ck_ai_job_service_tier'), 'ai_job', type_='check')
    op.drop_constraint(op.f('fk_ai_job_reused_from_job_id_ai_job'), 'ai_job', type_='foreignkey')
    for column in (
        'reused_from_job_id', 'reuse_allowed', 'offpeak_on_deadline', 'offpeak_deadline_at',
        'service_tier',
    ):
        op.drop_column('ai_job', column)
