"""The relay's claim finds a waiting job's enqueue row by its job, in an index of pending enqueue
rows only.

The claim's window probes each waiting job's pending enqueue row by `aggregate_id`. With
statistics taken while few rows were pending (a queue table's pending count swings from none to
thousands within seconds, faster than autovacuum analyzes it), the planner read that probe from
`ix_outbox_event_dispatchable` (every pending row, by `available_at`) and filtered by job: the
whole backlog read once per waiting job, 30,000 buffers and 9 of a claim's 11 ms at 500 waiting
jobs. `ix_outbox_event_pending_enqueue` holds the pending enqueue rows by job, so the probe is one
index lookup whichever statistics the planner has. A row leaves it when it is claimed.

Revision ID: 0040
Revises: 0039
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0040"
down_revision: str | None = "0039"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_outbox_event_pending_enqueue",
        "outbox_event",
        ["aggregate_id"],
        postgresql_where=sa.text("status = 'pending' AND event_type = 'ai.job.enqueue'"),
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_event_pending_enqueue", table_name="outbox_event")
