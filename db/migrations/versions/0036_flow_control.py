"""flow control: keyed concurrency, start-by TTL, deadlines, operator pauses

`ai_job` gains what flow control decides with (engine/flow.py): `concurrency` (the create's
member as given), `concurrency_key` (the user's active jobs with one key meet at create,
`ix_ai_job_user_concurrency_key`), `debounce_until` (a debounce chain's latest start),
`superseded_by` (the newer job that replaced this one), `expires_at` (the start-by time of a
TTL), `deadline_at` and `cancel_code` (what a requested cancel ends the job with). The relay
reads the next start-by time and deadline of the jobs it has not dispatched through
`ix_ai_job_expires_undispatched` and `ix_ai_job_deadline_undispatched`.

`ai_pause`: operator pauses in force; `ai_pause_hold`: the jobs a pause holds before their
call; `ai_resume_pace`: the one row that paces their release across processes.
`ai_schedule.ttl_s`: each run's job's start-by TTL (a schedule's job template).

Revision ID: 0036
Revises: 0038
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0036"
down_revision: str | None = "0038"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
_ACTIVE = "lifecycle_status IN ('queued', 'running')"


def _unsent(column: str) -> sa.TextClause:
    return sa.text(f"lifecycle_status = 'queued' AND dispatched_at IS NULL AND {column} IS NOT NULL")


def upgrade() -> None:
    op.add_column("ai_job", sa.Column("concurrency", postgresql.JSONB(), nullable=True))
    op.add_column("ai_job", sa.Column("concurrency_key", sa.String(length=200), nullable=True))
    op.add_column("ai_job", sa.Column("debounce_until", _TS, nullable=True))
    op.add_column("ai_job", sa.Column("superseded_by", postgresql.UUID(as_uuid=True), nullable=True))
    op.add_column("ai_job", sa.Column("expires_at", _TS, nullable=True))
    op.add_column("ai_job", sa.Column("deadline_at", _TS, nullable=True))
    op.add_column("ai_job", sa.Column("cancel_code", sa.String(length=64), nullable=True))
    op.create_index(
        "ix_ai_job_user_concurrency_key",
        "ai_job",
        ["user_id", "concurrency_key"],
        postgresql_where=sa.text(f"concurrency_key IS NOT NULL AND {_ACTIVE}"),
    )
    op.create_index(
        "ix_ai_job_expires_undispatched",
        "ai_job",
        ["expires_at"],
        postgresql_where=_unsent("expires_at"),
    )
    op.create_index(
        "ix_ai_job_deadline_undispatched",
        "ai_job",
        ["deadline_at"],
        postgresql_where=_unsent("deadline_at"),
    )
    op.create_table(
        "ai_pause",
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("job_type", sa.String(length=64), nullable=True),
        sa.Column("provider", sa.String(length=64), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("user_id", sa.String(length=128), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("expires_at", _TS, nullable=True),
        sa.Column("created_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.CheckConstraint(
            "coalesce(job_type, provider, model, user_id) IS NOT NULL",
            name=op.f("ck_ai_pause_matches_something"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ai_pause")),
    )
    op.create_index(
        "ix_ai_pause_expires",
        "ai_pause",
        ["expires_at"],
        postgresql_where=sa.text("expires_at IS NOT NULL"),
    )
    op.create_table(
        "ai_pause_hold",
        sa.Column("job_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("workflow_id", sa.String(length=255), nullable=False),
        sa.Column("job_type", sa.String(length=64), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("turn", sa.BigInteger(), nullable=False),
        sa.Column("held_at", _TS, server_default=sa.text("clock_timestamp()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["ai_job.id"],
            name=op.f("fk_ai_pause_hold_job_id_ai_job"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_ai_pause_hold")),
    )
    op.create_index("ix_ai_pause_hold_user_turn", "ai_pause_hold", ["user_id", "turn"])
    op.add_column("ai_schedule", sa.Column("ttl_s", sa.Integer(), nullable=True))
    op.create_table(
        "ai_resume_pace",
        sa.Column("id", sa.SmallInteger(), nullable=False),
        sa.Column("next_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ai_resume_pace")),
    )


def downgrade() -> None:
    op.drop_table("ai_resume_pace")
    op.drop_column("ai_schedule", "ttl_s")
    op.drop_index("ix_ai_pause_hold_user_turn", table_name="ai_pause_hold")
    op.drop_table("ai_pause_hold")
    op.drop_index("ix_ai_pause_expires", table_name="ai_pause")
    op.drop_table("ai_pause")
    op.drop_index("ix_ai_job_deadline_undispatched", table_name="ai_job")
    op.drop_index("ix_ai_job_expires_undispatched", table_name="ai_job")
    op.drop_index("ix_ai_job_user_concurrency_key", table_name="ai_job")
    for column in (
        "cancel_code",
        "deadline_at",
        "expires_at",
        "superseded_by",
        "debounce_until",
        "concurrency_key",
        "concurrency",
    ):
        op.drop_column("ai_job", column)
