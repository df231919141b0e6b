"""batch caps, idempotent submission, held reservations and provider files

- `ai_batch.byte_count`: the JSONL bytes of the lines enrolled in a batch (with `item_count`,
  what AI_BATCH_MAX_BYTES and AI_BATCH_MAX_LINES are checked against at each enroll);
  `ai_batch.upload_started_at`: when its first upload began. From then on its file's lines are
  fixed (the items not ended), and a retried submit looks for what an earlier attempt may have
  made at the provider (a file by its name, a batch by its `ai_batch_id` metadata) before it
  makes anything again.
- `ai_batch_item.line_bytes`: the item's JSONL line size, as it is uploaded.
- `ix_ai_batch_item_held`: the items whose outcome is not recorded yet: one whose job ended
  meanwhile (it left a closed batch) holds the job's reservation open (db/budgets.py, open
  reservations).
- `ai_batch_file`: each file the engine made or found at the provider for a batch (its input,
  output and error files, and an upload no batch uses), until it is deleted there; the files
  of the batches recorded so far are entered too (those of ended batches are then deleted by
  the reconciler's retention phase).

Revision ID: 0032
Revises: 0031
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0032"
down_revision: str | None = '0031'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
_ROLE = "'input','output','error','orphan'"


def upgrade() -> None:
    op.add_column(
        "ai_batch",
        sa.Column("byte_count", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column("ai_batch", sa.Column("upload_started_at", _TS, nullable=True))
    op.add_column(
        "ai_batch_item",
        sa.Column("line_bytes", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.create_index(
        "ix_ai_batch_item_held",
        "ai_batch_item",
        ["job_id"],
        unique=False,
        postgresql_where=sa.text("ended_at IS NULL"),
    )
    op.create_table(
        "ai_batch_file",
        sa.Column("batch_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("file_id", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.Column("deleted_at", _TS, nullable=True),
        sa.Column("delete_attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_try_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint(f"role IN ({_ROLE})", name=op.f("ck_ai_batch_file_role")),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["ai_batch.id"],
            name=op.f("fk_ai_batch_file_batch_id_ai_batch"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("batch_id", "file_id", name=op.f("pk_ai_batch_file")),
    )
    op.create_index(
        "ix_ai_batch_file_undeleted",
        "ai_batch_file",
        ["next_try_at"],
        unique=False,
        postgresql_where=sa.text("deleted_at IS NULL"),
    )
    op.execute(
        """
        INSERT INTO ai_batch_file (batch_id, file_id, role)
        SELECT id, input_file_id, 'input' FROM ai_batch WHERE input_file_id IS NOT NULL
        UNION ALL
        SELECT id, output_file_id, 'output' FROM ai_batch WHERE output_file_id IS NOT NULL
        UNION ALL
        SELECT id, error_file_id, 'error' FROM ai_batch WHERE error_file_id IS NOT NULL
        ON CONFLICT (batch_id, file_id) DO NOTHING
        """
    )


def downgrade() -> None:
    op.drop_index("ix_ai_batch_file_undeleted", table_name="ai_batch_file")
    op.drop_table("ai_batch_file")
    op.drop_index("ix_ai_batch_item_held", table_name="ai_batch_item")
    op.drop_column("ai_batch_item", "line_bytes")
    op.drop_column("ai_batch", "upload_started_at")
    op.drop_column("ai_batch", "byte_count")
