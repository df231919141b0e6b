"""schedule events in the job outbox: `ai_schedule_command` goes

A schedule's changes are now rows of `outbox_event` (`ai.schedule.sync`, `ai.schedule.trigger`,
aggregate `schedule`, `aggregate_id` the schedule id), written with the change and dispatched by
the relay like any outbox row. This migration:

- moves the pending commands into the outbox: a trigger becomes an `ai.schedule.trigger` row
  for its time; a sync becomes one `ai.schedule.sync` row per schedule;
- adds an `ai.schedule.sync` row for every existing schedule, so that the relay rewrites each
  Temporal schedule to start its runs on the `ai-schedules` task queue (its own slots in the
  `ai-system` process) instead of `ai-system`;
- drops `ai_schedule_command` (and its index);
- adds `ix_ai_schedule_run_created`: the retention pass deletes run rows oldest first.

The downgrade puts the pending schedule events back as commands.

Revision ID: 0031
Revises: 0028
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0031'
down_revision: str | None = '0028'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
# RFC 3339 in UTC, as the engine writes a trigger's time (engine/schedules.py `iso`).
_ISO = """to_char(c.run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""

MOVE_TRIGGERS = f"""
INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,
                          status, attempt_count, available_at, created_at)
SELECT 'ai.schedule.trigger', 'schedule', c.schedule_id::text,
       'ai.schedule.trigger:' || c.schedule_id::text || ':' || {_ISO},
       jsonb_build_object('scheduleId', c.schedule_id::text, 'scheduledAt', {_ISO}),
       'pending', 0, now(), c.created_at
FROM ai_schedule_command c
WHERE c.done_at IS NULL AND c.command = 'trigger' AND c.run_at IS NOT NULL
ON CONFLICT (dedupe_key) DO NOTHING
"""

SYNC_ALL = """
INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,
                          status, attempt_count, available_at, created_at)
SELECT 'ai.schedule.sync', 'schedule', s.id::text,
       'ai.schedule.sync:' || s.id::text || ':migrated-0031',
       jsonb_build_object('scheduleId', s.id::text),
       'pending', 0, now(), now()
FROM (SELECT schedule_id AS id FROM ai_schedule_command WHERE done_at IS NULL AND command = 'sync'
      UNION SELECT id FROM ai_schedule) s
ON CONFLICT (dedupe_key) DO NOTHING
"""

MOVE_BACK = """
INSERT INTO ai_schedule_command (schedule_id, command, run_at, created_at)
SELECT aggregate_id::uuid,
       CASE event_type WHEN 'ai.schedule.sync' THEN 'sync' ELSE 'trigger' END,
       CASE event_type WHEN 'ai.schedule.trigger'
            THEN (payload->>'scheduledAt')::timestamptz END,
       created_at
FROM outbox_event
WHERE event_type IN ('ai.schedule.sync', 'ai.schedule.trigger')
  AND status IN ('pending', 'processing')
"""


def _sql(statement: str) -> None:
    """As written: its colons are text (times, keys), not bind parameters."""
    op.get_bind().exec_driver_sql(statement)


def upgrade() -> None:
    _sql(MOVE_TRIGGERS)
    _sql(SYNC_ALL)
    op.execute("NOTIFY ai_outbox")
    op.drop_index('ix_ai_schedule_command_due', table_name='ai_schedule_command')
    op.drop_table('ai_schedule_command')
    op.create_index('ix_ai_schedule_run_created', 'ai_schedule_run', ['created_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_ai_schedule_run_created', table_name='ai_schedule_run')
    op.create_table(
        'ai_schedule_command',
        sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column('schedule_id', postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column('command', sa.String(length=16), nullable=False),
        sa.Column('run_at', _TS, nullable=True),
        sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('available_at', _TS, server_default=sa.func.now(), nullable=False),
        sa.Column('locked_until', _TS, nullable=True),
        sa.Column('done_at', _TS, nullable=True),
        sa.Column('last_error', sa.String(length=300), nullable=True),
        sa.Column('created_at', _TS, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_ai_schedule_command')),
    )
    op.create_index(
        'ix_ai_schedule_command_due',
        'ai_schedule_command',
        ['available_at'],
        unique=False,
        postgresql_where=sa.text('done_at IS NULL'),
    )
    _sql(MOVE_BACK)
    op.execute(
        "DELETE FROM outbox_event WHERE event_type IN ('ai.schedule.sync', 'ai.schedule.trigger')"
    )
