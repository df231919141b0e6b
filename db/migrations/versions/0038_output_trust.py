"""output you can trust: structured-output downgrades, rollouts and their guard, feedback,
moderation's held answers

`ai_structured_downgrade`: the lower structured-output form a (base URL, model) took after it
refused a higher one with a 400, until `expires_at` (AI_STRUCTURED_DOWNGRADE_TTL_S); read in
EXECUTE's first transaction by every worker (jobs/structured_output.py).

`ai_rollout` (one per job type; `id` changes with every PUT, and the figures count only jobs and
feedback of that id) and `ai_rollout_arm` (its arms: weight, prompt version and/or model, state).
`ai_job.rollout_id` / `rollout_arm` / `arm_model` record a create's arm; `ai_job_feedback` one
score per job and owner, with the arm, prompt version and model it was given for.

The guard (`ai_rollout_guard`) runs in the transaction that ends a job of a rollout (trigger
`ai_job_rollout_ended`) and in the one that stores a feedback of one (`ai_job_feedback_guard`):
no other job pays anything (the triggers' WHEN needs a rollout id). It halts an active arm whose
feedback mean or success rate fell under the guard's floor after `min_samples`, never the last
active arm (the rollout's arms are locked in name order first, so two endings cannot halt the
last two), writes the `rollout.arm_halted` audit entry (actor `system`) and NOTIFYs
`ai_rollout_changed` with the job type, for the processes' rollout caches.

`ai_job.flagged_items` (and the chunk's): output items moderation dropped. `held_answer`: a
provider's answer (as the provider wrote it, placeholders and all) kept while its moderation
could not run, so the retry moderates it again without a new call; private data, cleared by
the purge. `ai_usage_log.structured_output`: the form a call was asked with.

Revision ID: 0038
Revises: 0037
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0038"
down_revision: str | None = '0037'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)

GUARD_FUNCTION = """
CREATE OR REPLACE FUNCTION ai_rollout_guard(r uuid, arm_name text) RETURNS void AS $$
DECLARE
    g record;
    ended record;
    fb record;
    reason text := NULL;
    others integer;
BEGIN
    SELECT ro.job_type, ro.min_samples, ro.min_mean_feedback, ro.min_success_rate, a.state
      INTO g
      FROM ai_rollout ro JOIN ai_rollout_arm a ON a.rollout_id = ro.id AND a.name = arm_name
     WHERE ro.id = r;
    IF NOT FOUND OR g.state <> 'active' THEN
        RETURN;
    END IF;
    SELECT count(*) AS n, avg(score) AS mean INTO fb
      FROM ai_job_feedback WHERE rollout_id = r AND rollout_arm = arm_name;
    IF fb.n >= g.min_samples AND fb.mean < g.min_mean_feedback THEN
        reason := 'feedback';
    ELSE
        SELECT count(*) FILTER (WHERE lifecycle_status = 'succeeded') AS ok,
               count(*) FILTER (WHERE lifecycle_status = 'failed') AS bad
          INTO ended
          FROM ai_job
         WHERE rollout_id = r AND rollout_arm = arm_name
           AND lifecycle_status IN ('succeeded', 'failed');
        IF ended.ok + ended.bad >= g.min_samples AND ended.ok + ended.bad > 0
           AND ended.ok::numeric / (ended.ok + ended.bad) < g.min_success_rate THEN
            reason := 'success_rate';
        END IF;
    END IF;
    IF reason IS NULL THEN
        RETURN;
    END IF;
    -- Every arm of the rollout locked, in one order: two halts cannot both see the other arm
    -- still active.
    PERFORM 1 FROM ai_rollout_arm WHERE rollout_id = r ORDER BY name FOR UPDATE;
    SELECT count(*) INTO others FROM ai_rollout_arm
     WHERE rollout_id = r AND state = 'active' AND name <> arm_name;
    IF others = 0 THEN
        RETURN;
    END IF;
    UPDATE ai_rollout_arm SET state = 'halted', halted_reason = reason, halted_at = now()
     WHERE rollout_id = r AND name = arm_name AND state = 'active';
    IF FOUND THEN
        INSERT INTO admin_audit (actor, action, target_type, target_id, detail, outcome)
        VALUES ('system', 'rollout.arm_halted', 'rollout', g.job_type,
                jsonb_build_object('arm', arm_name, 'reason', reason,
                                   'rolloutId', r::text), 'ok');
        PERFORM pg_notify('ai_rollout_changed', g.job_type);
    END IF;
END;
$$ LANGUAGE plpgsql;
"""

JOB_ENDED_FUNCTION = """
CREATE OR REPLACE FUNCTION ai_job_rollout_ended() RETURNS trigger AS $$
BEGIN
    PERFORM ai_rollout_guard(NEW.rollout_id, NEW.rollout_arm);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""

JOB_ENDED_TRIGGER = """
CREATE TRIGGER ai_job_rollout_ended
    AFTER UPDATE OF lifecycle_status ON ai_job
    FOR EACH ROW
    WHEN (NEW.rollout_id IS NOT NULL
          AND OLD.lifecycle_status IS DISTINCT FROM NEW.lifecycle_status
          AND NEW.lifecycle_status IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION ai_job_rollout_ended();
"""

FEEDBACK_TRIGGER = """
CREATE TRIGGER ai_job_feedback_guard
    AFTER INSERT OR UPDATE OF score ON ai_job_feedback
    FOR EACH ROW
    WHEN (NEW.rollout_id IS NOT NULL)
    EXECUTE FUNCTION ai_job_rollout_ended();
"""


def upgrade() -> None:
    op.create_table(
        "ai_structured_downgrade",
        sa.Column("base_url", sa.String(length=512), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("form", sa.String(length=16), nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint(
            "form IN ('json_object','none')", name=op.f("ck_ai_structured_downgrade_form")
        ),
        sa.PrimaryKeyConstraint("base_url", "model", name=op.f("pk_ai_structured_downgrade")),
    )
    op.create_table(
        "ai_rollout",
        sa.Column("job_type", sa.String(length=64), nullable=False),
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("min_samples", sa.Integer(), nullable=False),
        sa.Column("min_mean_feedback", sa.Numeric(6, 4), nullable=False),
        sa.Column("min_success_rate", sa.Numeric(6, 4), nullable=False),
        sa.Column("updated_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("job_type", name=op.f("pk_ai_rollout")),
        sa.UniqueConstraint("id", name=op.f("uq_ai_rollout_id")),
    )
    op.create_table(
        "ai_rollout_arm",
        sa.Column("rollout_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("prompt_version", sa.String(length=128), nullable=True),
        sa.Column("model", sa.String(length=128), nullable=True),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), server_default=sa.text("'active'"), nullable=False),
        sa.Column("halted_reason", sa.String(length=16), nullable=True),
        sa.Column("halted_at", _TS, nullable=True),
        sa.CheckConstraint("state IN ('active','halted')", name=op.f("ck_ai_rollout_arm_state")),
        sa.CheckConstraint(
            "halted_reason IS NULL OR halted_reason IN ('feedback','success_rate')",
            name=op.f("ck_ai_rollout_arm_halted_reason"),
        ),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["ai_rollout.id"],
            name=op.f("fk_ai_rollout_arm_rollout_id_ai_rollout"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("rollout_id", "name", name=op.f("pk_ai_rollout_arm")),
    )
    op.add_column("ai_job", sa.Column("rollout_id", postgresql.UUID(as_uuid=True)))
    op.add_column("ai_job", sa.Column("rollout_arm", sa.String(length=64)))
    op.add_column("ai_job", sa.Column("arm_model", sa.String(length=128)))
    op.add_column("ai_job", sa.Column("flagged_items", sa.Integer()))
    op.add_column("ai_job", sa.Column("held_answer", sa.Text()))
    op.create_index(
        "ix_ai_job_rollout",
        "ai_job",
        ["rollout_id", "rollout_arm", "lifecycle_status"],
        postgresql_where=sa.text("rollout_id IS NOT NULL"),
    )
    op.add_column("ai_job_chunk", sa.Column("flagged_items", sa.Integer()))
    op.add_column("ai_job_chunk", sa.Column("held_answer", sa.Text()))
    op.add_column("ai_usage_log", sa.Column("structured_output", sa.String(length=16)))
    op.create_table(
        "ai_job_feedback",
        sa.Column("job_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("score", sa.Numeric(6, 4), nullable=False),
        sa.Column("item_ordinal", sa.Integer(), nullable=True),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("rollout_id", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("rollout_arm", sa.String(length=64), nullable=True),
        sa.Column("prompt_version", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=True),
        sa.Column("created_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("score BETWEEN -1 AND 1", name=op.f("ck_ai_job_feedback_score")),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["ai_job.id"],
            name=op.f("fk_ai_job_feedback_job_id_ai_job"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "user_id", name=op.f("pk_ai_job_feedback")),
    )
    op.create_index(
        "ix_ai_job_feedback_rollout",
        "ai_job_feedback",
        ["rollout_id", "rollout_arm"],
        postgresql_where=sa.text("rollout_id IS NOT NULL"),
    )
    op.execute(GUARD_FUNCTION)
    op.execute(JOB_ENDED_FUNCTION)
    op.execute(JOB_ENDED_TRIGGER)
    op.execute(FEEDBACK_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS ai_job_feedback_guard ON ai_job_feedback")
    op.execute("DROP TRIGGER IF EXISTS ai_job_rollout_ended ON ai_job")
    op.execute("DROP FUNCTION IF EXISTS ai_job_rollout_ended()")
    op.execute("DROP FUNCTION IF EXISTS ai_rollout_guard(uuid, text)")
    op.drop_index("ix_ai_job_feedback_rollout", table_name="ai_job_feedback")
    op.drop_table("ai_job_feedback")
    op.drop_column("ai_usage_log", "structured_output")
    op.drop_column("ai_job_chunk", "held_answer")
    op.drop_column("ai_job_chunk", "flagged_items")
    op.drop_index("ix_ai_job_rollout", table_name="ai_job")
    for column in ("held_answer", "flagged_items", "arm_model", "rollout_arm", "rollout_id"):
        op.drop_column("ai_job", column)
    op.drop_table("ai_rollout_arm")
    op.drop_table("ai_rollout")
    op.drop_table("ai_structured_downgrade")
