"""result reuse: a job's reuse key, its lookup index, and the NOTIFY that wakes its dependents

`ai_job.reuse_key` (sha256 of the job type, the normalized input's hash, the prompt version,
the model and the output schema version; set on every create of a type that permits reuse,
jobs/reuse.py) and the index a create's lookup reads (a user's jobs of one type with one key).
`ix_ai_job_reused_from` serves the dependents' read (the queued jobs waiting on a source) and
the foreign key's ON DELETE SET NULL.

The trigger `ai_job_reuse_source_ended`: when a job with a reuse key ends (succeeded, failed,
cancelled) and a queued job reuses it, `pg_notify('ai_reuse_source_ended', <its id>)` in the
ending's transaction (delivered at its commit, whichever code path ended it: PROJECT, a
finalizer, the cancel API, the reconciler). The reuse waker (runtime/reuse_waker.py) LISTENs
and signals the dependents' workflows.

Revision ID: 0028
Revises: 0027
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0028'
down_revision: str | None = '0027'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NOTIFY_FUNCTION = """
CREATE OR REPLACE FUNCTION ai_job_reuse_source_ended() RETURNS trigger AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM ai_job d
               WHERE d.reused_from_job_id = NEW.id AND d.lifecycle_status = 'queued') THEN
        PERFORM pg_notify('ai_reuse_source_ended', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""

NOTIFY_TRIGGER = """
CREATE TRIGGER ai_job_reuse_source_ended
    AFTER UPDATE OF lifecycle_status ON ai_job
    FOR EACH ROW
    WHEN (NEW.reuse_key IS NOT NULL
          AND OLD.lifecycle_status IS DISTINCT FROM NEW.lifecycle_status
          AND NEW.lifecycle_status IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION ai_job_reuse_source_ended();
"""


def upgrade() -> None:
    op.add_column('ai_job', sa.Column('reuse_key', sa.String(length=64), nullable=True))
    op.create_index(
        'ix_ai_job_user_reuse_key', 'ai_job', ['user_id', 'job_type', 'reuse_key'],
        postgresql_where=sa.text('reuse_key IS NOT NULL'),
    )
    op.create_index(
        'ix_ai_job_reused_from', 'ai_job', ['reused_from_job_id'],
        postgresql_where=sa.text('reused_from_job_id IS NOT NULL'),
    )
    op.execute(NOTIFY_FUNCTION)
    op.execute(NOTIFY_TRIGGER)


def downgrade() -> None:
    op.execute('DROP TRIGGER IF EXISTS ai_job_reuse_source_ended ON ai_job')
    op.execute('DROP FUNCTION IF EXISTS ai_job_reuse_source_ended()')
    op.drop_index('ix_ai_job_reused_from', table_name='ai_job')
    op.drop_index('ix_ai_job_user_reuse_key', table_name='ai_job')
    op.drop_column('ai_job', 'reuse_key')
