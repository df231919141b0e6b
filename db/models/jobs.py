"""The job tables: the job, its chunks, snapshot, artifacts and outbox rows, users' keys."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    Numeric,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from db.lifecycle import ACTIVE_SQL, TERMINAL_SQL
from db.models.base import TS, Base, encrypted

_REUSE, _REUSED = text("reuse_key IS NOT NULL"), text("reused_from_job_id IS NOT NULL")
_ORG_ACTIVE = text(f"org_id IS NOT NULL AND {ACTIVE_SQL}")
_TEAMS_ACTIVE = text(f"team_ids <> '{{}}' AND {ACTIVE_SQL}")
_TAGS_ACTIVE = text(f"tags <> '{{}}' AND {ACTIVE_SQL}")


def _UNSENT(column: str) -> Any:
    """A queued job not dispatched yet, with `column` set (the relay's expiry indexes)."""
    return text(f"lifecycle_status = 'queued' AND dispatched_at IS NULL AND {column} IS NOT NULL")


class AiJob(Base):
    __tablename__ = "ai_job"
    __table_args__ = (
        UniqueConstraint("user_id", "job_type", "idempotency_key"),
        CheckConstraint(
            "lifecycle_status IN ('queued','running','succeeded','failed','cancelled')",
            name="lifecycle_status",
        ),
        CheckConstraint(
            "status IN ('pending','processing','completed','failed','cancelled')",
            name="legacy_status",
        ),
        CheckConstraint("priority BETWEEN 0 AND 100", name="priority"),
        CheckConstraint("progress BETWEEN 0 AND 100", name="progress"),
        CheckConstraint(
            "credential_mode IN ('platform_key','user_deepseek_key')", name="credential_mode"
        ),
        CheckConstraint("service_tier IN ('standard','batch','offpeak')", name="service_tier"),
        CheckConstraint(
            "offpeak_on_deadline IS NULL OR offpeak_on_deadline IN ('standard','fail')",
            name="offpeak_on_deadline",
        ),
        # Lists: a user's own jobs newest first; admin filters; the reconciler's sweep.
        Index("ix_ai_job_user_created", "user_id", "created_at", "id"),
        # The event streams' resume query: a user's jobs changed since a moment, oldest first.
        Index("ix_ai_job_user_updated", "user_id", "updated_at"),
        Index("ix_ai_job_created", "created_at", "id"),
        Index(
            "ix_ai_job_running_lock",
            "lock_until",
            postgresql_where=text("lifecycle_status = 'running'"),
        ),
        Index(
            "ix_ai_job_user_active",
            "user_id",
            postgresql_where=text(ACTIVE_SQL),
        ),
        Index(
            "ix_ai_job_retention",
            "created_at",
            postgresql_where=text(f"private_data_purged_at IS NULL AND {TERMINAL_SQL}"),
        ),
        Index("ix_ai_job_user_status_created", "user_id", "lifecycle_status", "created_at", "id"),
        Index("ix_ai_job_user_type_created", "user_id", "job_type", "created_at", "id"),
        Index("ix_ai_job_status_created", "lifecycle_status", "created_at", "id"),
        Index("ix_ai_job_type_created", "job_type", "created_at", "id"),
        Index("ix_ai_job_queue_created", "queue_name", "created_at", "id"),
        # A user's jobs about one of their product's things (`targetType`, `targetId`).
        Index(
            "ix_ai_job_user_target_created",
            "user_id",
            "target_type",
            "target_id",
            "created_at",
            "id",
        ),
        # The list filter `metadata.<key>=<value>` is a containment test (`metadata @> ...`).
        Index(
            "ix_ai_job_metadata",
            "metadata",
            postgresql_using="gin",
            postgresql_ops={"metadata": "jsonb_path_ops"},
        ),
        # The user dispatch window (db/relay.py): a user's held jobs that are due, in dispatch
        # order; the user's dispatched jobs that have not ended; the jobs not due yet.
        Index(
            "ix_ai_job_undispatched",
            "user_id",
            "priority",
            "created_at",
            "id",
            postgresql_where=text(
                "dispatched_at IS NULL AND lifecycle_status = 'queued' AND due_at IS NULL"
            ),
        ),
        Index("ix_ai_job_due", "due_at", postgresql_where=text("due_at IS NOT NULL")),
        Index(
            "ix_ai_job_user_dispatched",
            "user_id",
            postgresql_where=text(
                "dispatched_at IS NOT NULL AND lifecycle_status IN ('queued', 'running')"
            ),
        ),
        # Result reuse (jobs/reuse.py): a create's lookup; the jobs waiting on a source.
        Index(
            "ix_ai_job_user_reuse_key", "user_id", "job_type", "reuse_key", postgresql_where=_REUSE
        ),
        Index("ix_ai_job_reused_from", "reused_from_job_id", postgresql_where=_REUSED),
        # A scope budget's open reservations: the active jobs of an organisation, a team or a
        # tag (db/scope_budgets.py names the same predicates).
        Index("ix_ai_job_org_active", "org_id", postgresql_where=_ORG_ACTIVE),
        Index(
            "ix_ai_job_teams_active",
            "team_ids",
            postgresql_using="gin",
            postgresql_where=_TEAMS_ACTIVE,
        ),
        Index(
            "ix_ai_job_tags_active", "tags", postgresql_using="gin", postgresql_where=_TAGS_ACTIVE
        ),
        # Flow control (engine/flow.py): a create's read of the user's active jobs with a key;
        # the relay's next start-by time and deadline among the jobs not dispatched yet.
        Index(
            "ix_ai_job_user_concurrency_key",
            "user_id",
            "concurrency_key",
            postgresql_where=text(f"concurrency_key IS NOT NULL AND {ACTIVE_SQL}"),
        ),
        Index(
            "ix_ai_job_expires_undispatched", "expires_at", postgresql_where=_UNSENT("expires_at")
        ),
        Index(
            "ix_ai_job_deadline_undispatched",
            "deadline_at",
            postgresql_where=_UNSENT("deadline_at"),
        ),
        Index(
            "ux_ai_job_retried_from",
            "retried_from_job_id",
            unique=True,
            postgresql_where=text("retried_from_job_id IS NOT NULL"),
        ),
        # A rollout's figures per arm (jobs/rollouts.py) and its guard's counts.
        Index(
            "ix_ai_job_rollout",
            "rollout_id",
            "rollout_arm",
            "lifecycle_status",
            postgresql_where=text("rollout_id IS NOT NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128))
    job_type: Mapped[str] = mapped_column(String(64))
    target_type: Mapped[str] = mapped_column(String(64))
    target_id: Mapped[str] = mapped_column(String(128))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_fingerprint: Mapped[str] = mapped_column(String(64))
    lifecycle_status: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    queue_name: Mapped[str] = mapped_column(String(32))
    priority: Mapped[int] = mapped_column(Integer)
    progress: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    input: Mapped[dict[str, Any]] = mapped_column(JSONB)
    credential_mode: Mapped[str] = mapped_column(String(32))
    # Keys are revoked, never deleted: RESTRICT keeps a job naming the key it was charged to.
    credential_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("user_model_credential.id", ondelete="RESTRICT")
    )
    # 128: a 64-character job type's default `<jobType>.output.v1` must fit.
    prompt_version: Mapped[str] = mapped_column(String(128))
    input_schema_version: Mapped[str] = mapped_column(String(128))
    output_schema_version: Mapped[str] = mapped_column(String(128))
    attempt_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    max_retry_count: Mapped[int] = mapped_column(Integer)
    locked_by: Mapped[str | None] = mapped_column(String(255))
    locked_at: Mapped[datetime | None] = mapped_column(TS)
    lock_until: Mapped[datetime | None] = mapped_column(TS)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(TS)
    started_at: Mapped[datetime | None] = mapped_column(TS)
    finished_at: Mapped[datetime | None] = mapped_column(TS)
    error_code: Mapped[str | None] = mapped_column(String(64))
    public_error_message: Mapped[str | None] = mapped_column(Text)
    internal_error_message: Mapped[str | None] = mapped_column(Text)
    output: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    output_hash: Mapped[str | None] = mapped_column(String(64))
    workflow_id: Mapped[str] = mapped_column(String(255))
    retried_from_job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    private_data_purged_at: Mapped[datetime | None] = mapped_column(TS)
    correction_hint: Mapped[str | None] = mapped_column(Text)
    # Tokens and money, fixed at create (db/budgets.py): the prompt's estimated input tokens,
    # the answer budget every call sends as `max_tokens` (the type's, or less under a per-job
    # cap), the client's per-job cap, the cost reserved against the user's budgets while the
    # job is active, and what its calls have cost so far.
    estimated_input_tokens: Mapped[int | None] = mapped_column(Integer)
    max_output_tokens: Mapped[int | None] = mapped_column(Integer)
    max_cost_usd: Mapped[Decimal | None] = mapped_column(Numeric(18, 8))
    reserved_cost_usd: Mapped[Decimal] = mapped_column(Numeric(18, 8), server_default=text("0"))
    spent_cost_usd: Mapped[Decimal] = mapped_column(Numeric(18, 8), server_default=text("0"))
    # A long source's chunks (ai_job_chunk rows); None: the job makes one call per attempt.
    chunk_count: Mapped[int | None] = mapped_column(Integer)
    # The job's provider calls numbered: each EXECUTE attempt's take raises it and the call's
    # usage row carries it (`ai_usage_log.call_no`), so a retried write of one call is one row.
    call_seq: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # When the relay claimed its enqueue row within its user's dispatch window (db/relay.py);
    # NULL while the job is held in the outbox.
    dispatched_at: Mapped[datetime | None] = mapped_column(TS)
    # A by-design wait before dispatch (a delayed job's runAt): not dispatched before then,
    # and taking no room in its user's window meanwhile; the relay's claim clears it once due.
    due_at: Mapped[datetime | None] = mapped_column(TS)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    # The client's own references (string keys and values, checked by the API; `{}`: none).
    # The attribute is not named `metadata`: declarative models reserve that name.
    job_metadata: Mapped[dict[str, str]] = mapped_column(
        "metadata", JSONB, server_default=text("'{}'::jsonb")
    )
    # When a delayed job may start (NULL: at once); the relay dispatches it then (`due_at`).
    run_at: Mapped[datetime | None] = mapped_column(TS)
    # How soon and at which price its calls are made (engine/tiers.py), fixed at create.
    service_tier: Mapped[str] = mapped_column(String(16), server_default=text("'standard'"))
    # An off-peak job's deadline and what it does when no discount window came before it.
    offpeak_deadline_at: Mapped[datetime | None] = mapped_column(TS)
    offpeak_on_deadline: Mapped[str | None] = mapped_column(String(16))
    # The create said `reuse: "allow"`; the same user's job whose answer this one reuses.
    reuse_allowed: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    reused_from_job_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="SET NULL")
    )
    # What a create asks, for result reuse (jobs/reuse.py); NULL: the type permits no reuse.
    reuse_key: Mapped[str | None] = mapped_column(String(64))
    # Whose money it is beyond its user's (db/models/budgets.py): the organisation and teams of
    # the token that created it, and the create's tags (in the client's order), fixed at create.
    org_id: Mapped[str | None] = mapped_column(String(64))
    team_ids: Mapped[list[str]] = mapped_column(
        ARRAY(String(64)), server_default=text("'{}'::varchar[]")
    )
    tags: Mapped[list[str]] = mapped_column(
        ARRAY(String(64)), server_default=text("'{}'::varchar[]")
    )
    # The rollout (its id at the create) and arm a create was given, and the arm's model
    # (tried first); NULL outside a rollout (jobs/rollouts.py).
    rollout_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    rollout_arm: Mapped[str | None] = mapped_column(String(64))
    arm_model: Mapped[str | None] = mapped_column(String(128))
    # Output items moderation dropped (NULL: no moderation ran); an answer kept while its
    # moderation could not run (private: the provider's text, placeholders included).
    flagged_items: Mapped[int | None] = mapped_column(Integer)
    held_answer: Mapped[str | None] = mapped_column(Text)
    # Flow control (engine/flow.py, jobs/flow.py). The create's `concurrency` as given, its key
    # (the user's active jobs with it meet at create), a debounce chain's latest start (its
    # first create + that create's maxDelayMs), the newer job that replaced this one.
    concurrency: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    concurrency_key: Mapped[str | None] = mapped_column(String(200))
    debounce_until: Mapped[datetime | None] = mapped_column(TS)
    superseded_by: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # The start-by time (its TTL: not admitted by then, it ends JOB_EXPIRED) and the deadline
    # (past it, JOB_DEADLINE_EXCEEDED wherever it is); NULL: none.
    expires_at: Mapped[datetime | None] = mapped_column(TS)
    deadline_at: Mapped[datetime | None] = mapped_column(TS)
    # The code a requested cancel ends the job with (SUPERSEDED, JOB_DEADLINE_EXCEEDED); NULL:
    # CANCELLED, the owner's or an admin's cancel.
    cancel_code: Mapped[str | None] = mapped_column(String(64))


class AiJobChunk(Base):
    """One chunk of a long source (db/chunks.py): its character range in the job's input (the
    text itself stays in the snapshot), the items it is asked for, its own attempts, and once it
    succeeded its validated output (private, like `ai_job.output`)."""

    __tablename__ = "ai_job_chunk"

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE"), primary_key=True
    )
    chunk_no: Mapped[int] = mapped_column(Integer, primary_key=True)
    start_char: Mapped[int] = mapped_column(Integer)
    end_char: Mapped[int] = mapped_column(Integer)
    input_tokens: Mapped[int] = mapped_column(Integer)  # the chunk call's estimated prompt
    item_count: Mapped[int] = mapped_column(Integer)  # items this chunk is asked for
    status: Mapped[str] = mapped_column(String(16), server_default=text("'pending'"))
    attempt_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    output: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    output_hash: Mapped[str | None] = mapped_column(String(64))
    error_code: Mapped[str | None] = mapped_column(String(64))
    finished_at: Mapped[datetime | None] = mapped_column(TS)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    # As the job's: items moderation dropped, an answer held while moderation was away.
    flagged_items: Mapped[int | None] = mapped_column(Integer)
    held_answer: Mapped[str | None] = mapped_column(Text)


class AiJobSnapshot(Base):
    __tablename__ = "ai_job_snapshot"

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE"), primary_key=True
    )
    content: Mapped[dict[str, Any]] = mapped_column(JSONB)
    redaction_version: Mapped[str] = mapped_column(String(16))
    expires_at: Mapped[datetime] = mapped_column(TS, index=True)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())


class AiJobArtifact(Base):
    __tablename__ = "ai_job_artifact"
    __table_args__ = (UniqueConstraint("job_id", "artifact_type", "artifact_id"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE")
    )
    artifact_type: Mapped[str] = mapped_column(String(64))
    artifact_id: Mapped[str] = mapped_column(String(128))
    ordinal: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())


class OutboxEvent(Base):
    __tablename__ = "outbox_event"
    __table_args__ = (
        CheckConstraint(
            "status IN ('pending','processing','published','failed','dead')", name="status"
        ),
        Index(
            "ix_outbox_event_dispatchable",
            "available_at",
            postgresql_where=text("status = 'pending'"),
        ),
        Index(
            "ix_outbox_event_processing",
            "locked_at",
            postgresql_where=text("status = 'processing'"),
        ),
        Index(
            "ix_outbox_event_published",
            "published_at",
            postgresql_where=text("status = 'published'"),
        ),
        Index(
            "ix_outbox_event_stalled",
            "status",
            "id",
            postgresql_where=text("status IN ('dead','failed')"),
        ),
        # The relay's claim (db/relay.py): pending rows that are not held, oldest due first;
        # and the held ones (enqueue rows waiting for room in their user's dispatch window).
        Index(
            "ix_outbox_event_ready",
            "available_at",
            "id",
            postgresql_where=text("status = 'pending' AND held_at IS NULL"),
        ),
        # The claim's probe for a waiting job's enqueue row (by job): one lookup, whatever
        # statistics the planner has of a table whose pending count swings.
        Index(
            "ix_outbox_event_pending_enqueue",
            "aggregate_id",
            postgresql_where=text("status = 'pending' AND event_type = 'ai.job.enqueue'"),
        ),
        Index(
            "ix_outbox_event_held",
            "id",
            postgresql_where=text("status = 'pending' AND held_at IS NOT NULL"),
        ),
        # The reconciler's revival cursor: parked enqueue rows only, in id order.
        Index(
            "ix_outbox_event_parked_enqueue",
            "id",
            postgresql_where=text("event_type = 'ai.job.enqueue' AND status IN ('dead','failed')"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    event_type: Mapped[str] = mapped_column(String(64))
    aggregate_type: Mapped[str] = mapped_column(String(64))
    aggregate_id: Mapped[str] = mapped_column(String(64), index=True)
    dedupe_key: Mapped[str] = mapped_column(String(512), unique=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16), server_default=text("'pending'"))
    attempt_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    revive_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    available_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    locked_by: Mapped[str | None] = mapped_column(String(255))
    locked_at: Mapped[datetime | None] = mapped_column(TS)
    last_error: Mapped[str | None] = mapped_column(Text)
    published_at: Mapped[datetime | None] = mapped_column(TS)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    # The W3C trace context of the request that wrote the row (traceparent, tracestate), so the
    # relay continues its trace; not part of the payload. NULL when tracing is off.
    trace_context: Mapped[dict[str, str] | None] = mapped_column(JSONB)
    # A pending enqueue row waiting for room in its user's dispatch window: since when
    # (db/relay.py); NULL for every other row.
    held_at: Mapped[datetime | None] = mapped_column(TS)


class UserModelCredential(Base):
    __tablename__ = "user_model_credential"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128), index=True)
    provider: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[str] = mapped_column(String(64))
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary, info=encrypted(key_id="key_id"))
    key_hint: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(TS)
