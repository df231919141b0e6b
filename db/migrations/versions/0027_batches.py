"""batches: the provider's batch tier

- `ai_batch`: one batch of one (provider, model, key, task queue): `open` while it gathers
  jobs (one open batch per group: a partial unique index), `submitting`, `submitted` (the
  provider's batch and file ids), then `completed`, `failed`, `expired` or `cancelled`; its
  Temporal workflow id `ai-batch:{id}`.
- `ai_batch_item`: one job's attempt in a batch, `custom_id` `job-{job_id}-a{attempt}`, its
  request `body` and the provider's `response` (job content: private, gone with the job),
  `pending → submitted → succeeded | failed`, or `cancelled` when its job left.

Revision ID: 0027
Revises: 0026
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0027"
down_revision: str | None = '0026'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
_BATCH = "'open','submitting','submitted','completed','failed','expired','cancelled'"
_ITEM = "'pending','submitted','succeeded','failed','cancelled'"


def upgrade() -> None:
    op.create_table(
        "ai_batch",
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("key_ref", sa.String(length=128), nullable=False),
        sa.Column("task_queue", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), server_default=sa.text("'open'"), nullable=False),
        sa.Column("provider_batch_id", sa.String(length=128), nullable=True),
        sa.Column("input_file_id", sa.String(length=128), nullable=True),
        sa.Column("output_file_id", sa.String(length=128), nullable=True),
        sa.Column("error_file_id", sa.String(length=128), nullable=True),
        sa.Column("workflow_id", sa.String(length=200), nullable=False),
        sa.Column("item_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.Column("submitted_at", _TS, nullable=True),
        sa.Column("ended_at", _TS, nullable=True),
        sa.CheckConstraint(f"status IN ({_BATCH})", name=op.f("ck_ai_batch_status")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ai_batch")),
    )
    op.create_index(
        "ux_ai_batch_open",
        "ai_batch",
        ["provider", "model", "key_ref", "task_queue"],
        unique=True,
        postgresql_where=sa.text("status = 'open'"),
    )
    op.create_table(
        "ai_batch_item",
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("batch_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("job_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.String(length=128), nullable=False),
        sa.Column(
            "status", sa.String(length=16), server_default=sa.text("'pending'"), nullable=False
        ),
        sa.Column("body", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("response", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("created_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.Column("ended_at", _TS, nullable=True),
        sa.CheckConstraint(f"status IN ({_ITEM})", name=op.f("ck_ai_batch_item_status")),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["ai_batch.id"],
            name=op.f("fk_ai_batch_item_batch_id_ai_batch"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["ai_job.id"],
            name=op.f("fk_ai_batch_item_job_id_ai_job"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ai_batch_item")),
        sa.UniqueConstraint("custom_id", name=op.f("uq_ai_batch_item_custom_id")),
    )
    op.create_index(
        "ix_ai_batch_item_batch_status", "ai_batch_item", ["batch_id", "status"], unique=False
    )
    op.create_index(
        "ix_ai_batch_item_job_attempt", "ai_batch_item", ["job_id", "attempt"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_ai_batch_item_job_attempt", table_name="ai_batch_item")
    op.drop_index("ix_ai_batch_item_batch_status", table_name="ai_batch_item")
    op.drop_table("ai_batch_item")
    op.drop_index("ux_ai_batch_open", table_name="ai_batch")
    op.drop_table("ai_batch")
