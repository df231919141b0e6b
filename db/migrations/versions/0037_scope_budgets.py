"""money above the user: a job's organisation, teams and tags; scope budgets, their daily spend
and alerts; the usage rollup by scope; the class of a call waiting for a provider limit

`ai_job.org_id`, `team_ids`, `tags` (and the same on `ai_schedule`, for its runs) with the
partial indexes a scope's open reservations are read through. `ai_scope_budget` (one per scope
and id), `ai_scope_usage_daily` (a scope's spend per UTC day, raised with each usage row of a
job of that scope), `ai_budget_alert` (each threshold sent once per period) and
`ai_usage_scoped_daily` (the usage API's rollup of scoped jobs).

The trigger `ai_scope_budget_alert` on `ai_scope_usage_daily`: in the transaction of the usage
row that raised a scope's day, when the scope has a budget with `alert_at`, every threshold its
period's spend has reached and that was not sent in this period is recorded in
`ai_budget_alert`, written as a published `ai.budget.threshold_crossed` outbox event and fanned
out to the admin webhooks (endpoints of the reserved owner '', which no token's `sub` can be),
with the deliverers' NOTIFY. A job without scopes never writes `ai_scope_usage_daily`: the
trigger never runs for it.

`limit_waiter.job_class` and `provider_call_lease.job_class`: the class (interactive,
background) of a call waiting for or holding a key's limits (AI_CAPACITY_RESERVE).

Revision ID: 0037
Revises: 0035
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0037'
down_revision: str | None = '0035'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ACTIVE = "lifecycle_status IN ('queued', 'running')"
SCOPE_CHECK = "scope IN ('org','team','tag')"
EMPTY = sa.text("'{}'::varchar[]")

ALERT_FUNCTION = """
CREATE OR REPLACE FUNCTION ai_scope_budget_alert() RETURNS trigger AS $$
DECLARE
    b record;
    start date;
    spent numeric;
    t numeric;
    inserted int;
BEGIN
    SELECT limit_usd, period, alert_at INTO b FROM ai_scope_budget
    WHERE scope = NEW.scope AND scope_id = NEW.scope_id;
    IF NOT FOUND OR cardinality(b.alert_at) = 0 THEN
        RETURN NULL;
    END IF;
    start := CASE WHEN b.period = 'day' THEN NEW.day
                  ELSE date_trunc('month', NEW.day)::date END;
    -- This day's row is locked by the usage row's upsert: concurrent usage rows of the scope
    -- and day reach this point one after the other, each seeing the others' spend.
    SELECT coalesce(sum(cost_usd), 0) INTO spent FROM ai_scope_usage_daily
    WHERE scope = NEW.scope AND scope_id = NEW.scope_id AND day BETWEEN start AND NEW.day;
    FOREACH t IN ARRAY b.alert_at LOOP
        CONTINUE WHEN spent < t * b.limit_usd;
        INSERT INTO ai_budget_alert (scope, scope_id, period, period_start, threshold, spent_usd)
        VALUES (NEW.scope, NEW.scope_id, b.period, start, t, spent)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS inserted = ROW_COUNT;
        CONTINUE WHEN inserted = 0;
        WITH ev AS (
            INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key,
                                      payload, status, attempt_count, available_at,
                                      created_at, published_at)
            VALUES ('ai.budget.threshold_crossed', 'budget',
                    left(NEW.scope || ':' || NEW.scope_id, 64),
                    'ai.budget.threshold_crossed:' || NEW.scope || ':' || NEW.scope_id || ':'
                        || b.period || ':' || start || ':' || t,
                    jsonb_build_object(
                        'scope', NEW.scope, 'scopeId', NEW.scope_id, 'period', b.period,
                        'periodStart', to_char(start, 'YYYY-MM-DD'), 'threshold', t,
                        'limitUsd', round(b.limit_usd, 8)::text,
                        'spentUsd', round(spent, 8)::text),
                    'published', 0, now(), now(), now())
            ON CONFLICT (dedupe_key) DO NOTHING
            RETURNING id, created_at)
        INSERT INTO webhook_delivery (endpoint_id, user_id, event_id, job_id, webhook_id,
                                      event_type, occurred_at, status, attempt_count,
                                      next_attempt_at, created_at)
        SELECT e.id, e.user_id, ev.id, 'budget:' || ev.id,
               'msg_' || ev.id || '_' || replace(e.id::text, '-', ''),
               'ai.budget.threshold_crossed', ev.created_at, 'pending', 0, now(), now()
        FROM ev JOIN webhook_endpoint e
             ON e.user_id = '' AND e.deleted_at IS NULL
            AND e.event_types ? 'ai.budget.threshold_crossed'
        ON CONFLICT (endpoint_id, event_id) DO NOTHING;
        PERFORM pg_notify('ai_webhook', '');
    END LOOP;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""

ALERT_TRIGGER = """
CREATE TRIGGER ai_scope_budget_alert
    AFTER INSERT OR UPDATE ON ai_scope_usage_daily
    FOR EACH ROW EXECUTE FUNCTION ai_scope_budget_alert();
"""


def _scopes(table: str) -> None:
    op.add_column(table, sa.Column('org_id', sa.String(length=64), nullable=True))
    op.add_column(
        table,
        sa.Column('team_ids', postgresql.ARRAY(sa.String(length=64)), server_default=EMPTY,
                  nullable=False),
    )
    op.add_column(
        table,
        sa.Column('tags', postgresql.ARRAY(sa.String(length=64)), server_default=EMPTY,
                  nullable=False),
    )


def upgrade() -> None:
    _scopes('ai_job')
    _scopes('ai_schedule')
    op.create_index('ix_ai_job_org_active', 'ai_job', ['org_id'],
                    postgresql_where=sa.text(f'org_id IS NOT NULL AND {ACTIVE}'))
    op.create_index('ix_ai_job_teams_active', 'ai_job', ['team_ids'], postgresql_using='gin',
                    postgresql_where=sa.text(f"team_ids <> '{{}}' AND {ACTIVE}"))
    op.create_index('ix_ai_job_tags_active', 'ai_job', ['tags'], postgresql_using='gin',
                    postgresql_where=sa.text(f"tags <> '{{}}' AND {ACTIVE}"))
    op.create_table(
        'ai_scope_budget',
        sa.Column('scope', sa.String(length=8), nullable=False),
        sa.Column('scope_id', sa.String(length=64), nullable=False),
        sa.Column('limit_usd', sa.Numeric(precision=18, scale=8), nullable=False),
        sa.Column('period', sa.String(length=8), nullable=False),
        sa.Column('alert_at', postgresql.ARRAY(sa.Numeric()),
                  server_default=sa.text("'{}'::numeric[]"), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.CheckConstraint(SCOPE_CHECK, name=op.f('ck_ai_scope_budget_scope')),
        sa.CheckConstraint("period IN ('day','month')", name=op.f('ck_ai_scope_budget_period')),
        sa.CheckConstraint('limit_usd > 0', name=op.f('ck_ai_scope_budget_limit_usd')),
        sa.PrimaryKeyConstraint('scope', 'scope_id', name=op.f('pk_ai_scope_budget')),
    )
    op.create_table(
        'ai_scope_usage_daily',
        sa.Column('scope', sa.String(length=8), nullable=False),
        sa.Column('scope_id', sa.String(length=64), nullable=False),
        sa.Column('day', sa.Date(), nullable=False),
        sa.Column('calls', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('cost_usd', sa.Numeric(precision=20, scale=8), server_default=sa.text('0'),
                  nullable=False),
        sa.CheckConstraint(SCOPE_CHECK, name=op.f('ck_ai_scope_usage_daily_scope')),
        sa.PrimaryKeyConstraint('scope', 'scope_id', 'day', name=op.f('pk_ai_scope_usage_daily')),
    )
    op.create_table(
        'ai_budget_alert',
        sa.Column('scope', sa.String(length=8), nullable=False),
        sa.Column('scope_id', sa.String(length=64), nullable=False),
        sa.Column('period', sa.String(length=8), nullable=False),
        sa.Column('period_start', sa.Date(), nullable=False),
        sa.Column('threshold', sa.Numeric(), nullable=False),
        sa.Column('spent_usd', sa.Numeric(precision=20, scale=8), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.PrimaryKeyConstraint('scope', 'scope_id', 'period', 'period_start', 'threshold',
                                name=op.f('pk_ai_budget_alert')),
    )
    op.create_table(
        'ai_usage_scoped_daily',
        sa.Column('day', sa.Date(), nullable=False),
        sa.Column('user_id', sa.String(length=128), nullable=False),
        sa.Column('job_type', sa.String(length=64), nullable=False),
        sa.Column('model', sa.String(length=128), nullable=False),
        sa.Column('credential_mode', sa.String(length=32), nullable=False),
        sa.Column('scope_key', sa.String(length=32), nullable=False),
        sa.Column('org_id', sa.String(length=64), nullable=True),
        sa.Column('team_ids', postgresql.ARRAY(sa.String(length=64)), server_default=EMPTY,
                  nullable=False),
        sa.Column('tags', postgresql.ARRAY(sa.String(length=64)), server_default=EMPTY,
                  nullable=False),
        sa.Column('calls', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('tokens_in', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('tokens_out', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('cost_usd', sa.Numeric(precision=20, scale=8), server_default=sa.text('0'),
                  nullable=False),
        sa.Column('estimated_cost_usd', sa.Numeric(precision=20, scale=8),
                  server_default=sa.text('0'), nullable=False),
        sa.PrimaryKeyConstraint('day', 'user_id', 'job_type', 'model', 'credential_mode',
                                'scope_key', name=op.f('pk_ai_usage_scoped_daily')),
    )
    op.create_index('ix_ai_usage_scoped_daily_org', 'ai_usage_scoped_daily', ['org_id', 'day'])
    op.add_column('limit_waiter', sa.Column('job_class', sa.String(length=16), nullable=True))
    op.add_column('provider_call_lease',
                  sa.Column('job_class', sa.String(length=16), nullable=True))
    op.execute(ALERT_FUNCTION)
    op.execute(ALERT_TRIGGER)


def downgrade() -> None:
    op.execute('DROP TRIGGER IF EXISTS ai_scope_budget_alert ON ai_scope_usage_daily')
    op.execute('DROP FUNCTION IF EXISTS ai_scope_budget_alert()')
    op.drop_column('provider_call_lease', 'job_class')
    op.drop_column('limit_waiter', 'job_class')
    op.drop_index('ix_ai_usage_scoped_daily_org', table_name='ai_usage_scoped_daily')
    op.drop_table('ai_usage_scoped_daily')
    op.drop_table('ai_budget_alert')
    op.drop_table('ai_scope_usage_daily')
    op.drop_table('ai_scope_budget')
    op.drop_index('ix_ai_job_tags_active', table_name='ai_job')
    op.drop_index('ix_ai_job_teams_active', table_name='ai_job')
    op.drop_index('ix_ai_job_org_active', table_name='ai_job')
    for table in ('ai_schedule', 'ai_job'):
        op.drop_column(table, 'tags')
        op.drop_column(table, 'team_ids')
        op.drop_column(table, 'org_id')
