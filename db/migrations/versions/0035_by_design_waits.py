"""by-design waits: a job that is not due yet takes no room in its user's dispatch window

`ai_job.due_at`: a by-design wait before dispatch (a delayed job's `runAt`): the relay does
not dispatch the job before then, and its claim clears the column once it has passed
(db/relay.py). `ix_ai_job_undispatched`, the window's scan of a user's held jobs, leaves such
jobs out (`due_at IS NULL`), so jobs waiting for their time cost the claim nothing;
`ix_ai_job_due` serves the claim's clearing and the relay's read of the next due time.

Existing delayed jobs not dispatched yet get their due time, and their enqueue rows become
available at it (the relay dispatched them at once before, and their workflows slept).

Revision ID: 0035
Revises: 0034
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0035"
down_revision: str | None = '0034'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HELD = "dispatched_at IS NULL AND lifecycle_status = 'queued'"


def upgrade() -> None:
    op.add_column("ai_job", sa.Column("due_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_ai_job_due", "ai_job", ["due_at"], postgresql_where=sa.text("due_at IS NOT NULL")
    )
    op.drop_index("ix_ai_job_undispatched", table_name="ai_job")
    op.create_index(
        "ix_ai_job_undispatched",
        "ai_job",
        ["user_id", "priority", "created_at", "id"],
        postgresql_where=sa.text(f"{_HELD} AND due_at IS NULL"),
    )
    op.execute(f"UPDATE ai_job SET due_at = run_at WHERE run_at > now() AND {_HELD}")
    op.execute(
        """
        UPDATE outbox_event o SET available_at = j.due_at
        FROM ai_job j
        WHERE j.due_at IS NOT NULL AND o.aggregate_id = j.id::text
          AND o.event_type = 'ai.job.enqueue' AND o.status = 'pending'
        """
    )


def downgrade() -> None:
    op.drop_index("ix_ai_job_undispatched", table_name="ai_job")
    op.create_index(
        "ix_ai_job_undispatched",
        "ai_job",
        ["user_id", "priority", "created_at", "id"],
        postgresql_where=sa.text(_HELD),
    )
    op.drop_index("ix_ai_job_due", table_name="ai_job")
    op.drop_column("ai_job", "due_at")
