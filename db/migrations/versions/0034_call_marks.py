"""call marks: a provider call EXECUTE is about to send, charged if its worker dies during it

`ai_call_mark`, one row per call sent and not yet settled: written in the first transaction of
its attempt (or of a fallback move) with the call's worst-case charge, deleted by the statement
that writes the call's usage row. A row left behind is a call whose worker died: the next
attempt's take, or the job's failed or cancelled ending, turns it into an `estimated` usage row
(db/call_marks.py). Keyed by the job and the call's number (`ai_job.call_seq`).

Revision ID: 0034
Revises: 0033
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0034'
down_revision: str | None = '0033'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'ai_call_mark',
        sa.Column('job_id', postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column('call_no', sa.Integer(), nullable=False),
        sa.Column('attempt_no', sa.Integer(), nullable=False),
        sa.Column('chunk_no', sa.Integer(), nullable=True),
        sa.Column('user_id', sa.String(length=128), nullable=False),
        sa.Column('job_type', sa.String(length=64), nullable=False),
        sa.Column('credential_mode', sa.String(length=32), nullable=False),
        sa.Column('provider', sa.String(length=64), nullable=False),
        sa.Column('model', sa.String(length=128), nullable=False),
        sa.Column('priced_as', sa.String(length=128), nullable=True),
        sa.Column('tokens_in', sa.Integer(), nullable=False),
        sa.Column('tokens_out', sa.Integer(), nullable=False),
        sa.Column('cost_usd', sa.Numeric(precision=18, scale=8), nullable=False),
        sa.Column('service_tier', sa.Text(), server_default=sa.text("'standard'"), nullable=False),
        sa.Column(
            'created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(['job_id'], ['ai_job.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('job_id', 'call_no'),
    )


def downgrade() -> None:
    op.drop_table('ai_call_mark')
