"""the specification's remaining gaps: credential foreign key, long job type names

- `ai_job.credential_id` references `user_model_credential.id` ON DELETE RESTRICT: keys are
  revoked, never deleted, and a job must keep naming the key it was charged to; a delete of a
  referenced key is a bug that must fail loudly, not silently unpin the job's history. Ids
  that point nowhere (possible before this constraint) are cleared first, then the constraint
  is added NOT VALID and validated separately, which holds a lighter lock on a large table.
- The version columns widen from 32 to 128 characters: a job type may be named with up to 64
  characters, and its default `<jobType>.output.v1` takes 74 (registration refuses a version
  longer than 128).

Revision ID: 0012
Revises: 0011
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION_COLUMNS = ('prompt_version', 'input_schema_version', 'output_schema_version')
FK = 'fk_ai_job_credential_id_user_model_credential'


def upgrade() -> None:
    for column in VERSION_COLUMNS:
        op.alter_column(
            'ai_job', column, type_=sa.String(length=128), existing_type=sa.String(length=32)
        )
    op.execute(
        """
        UPDATE ai_job SET credential_id = NULL
        WHERE credential_id IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM user_model_credential c WHERE c.id = ai_job.credential_id)
        """
    )
    op.execute(
        f"""
        ALTER TABLE ai_job ADD CONSTRAINT {FK} FOREIGN KEY (credential_id)
        REFERENCES user_model_credential (id) ON DELETE RESTRICT NOT VALID
        """
    )
    op.execute(f"ALTER TABLE ai_job VALIDATE CONSTRAINT {FK}")


def downgrade() -> None:
    op.drop_constraint(FK, 'ai_job', type_='foreignkey')
    for column in VERSION_COLUMNS:
        op.alter_column(
            'ai_job', column, type_=sa.String(length=32), existing_type=sa.String(length=128)
        )
