"""outbox statuses as the specification names them

The relay used to park a row that used up its attempts as `failed` and a row that could never be
dispatched (a malformed payload) as `dead`. The specification (ADR-003 §4.4) names them the other
way round: `dead` is a row whose attempts are used up (`attempt_count` >= 3), `failed` one that
can never be dispatched, parked at its first claim and never retried. Stored rows are renamed in
one statement (a swap); the CHECK constraint `ck_outbox_event_status` already allows both names
and the partial indexes cover both, so neither changes.

Revision ID: 0022
Revises: 0021
"""
from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = '0022'
down_revision: str | None = '0021'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SWAP = """
    UPDATE outbox_event
    SET status = CASE status WHEN 'failed' THEN 'dead' ELSE 'failed' END
    WHERE status IN ('failed', 'dead')
"""


def upgrade() -> None:
    op.execute(_SWAP)


def downgrade() -> None:
    op.execute(_SWAP)
