"""SQLAlchemy models of the tables (docs/contracts.md, "Tables").

The Alembic migrations are the schema; a test keeps the two equal.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column

from db.lifecycle import ACTIVE_SQL, TERMINAL_SQL

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


TS = DateTime(timezone=True)

# The column `info` key that marks a column holding ciphertext under CREDENTIAL_ENCRYPTION_KEY.
# `aijobs rotate-keys` re-encrypts every column so marked (it refuses to run if one has no
# rotation), and a test requires every binary column to be marked or declared not secret.
ENCRYPTED = "encrypted"


def encrypted(*, key_id: str) -> dict[str, Any]:
    """`info` of an encrypted column; `key_id` names the column holding its key id."""
    return {ENCRYPTED: {"key_id": key_id}}


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
        Index(
            "ux_ai_job_retried_from",
            "retried_from_job_id",
            unique=True,
            postgresql_where=text("retried_from_job_id IS NOT NULL"),
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
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())


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


class AiUsageLog(Base):
    __tablename__ = "ai_usage_log"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE"), index=True
    )
    user_id: Mapped[str] = mapped_column(String(128))
    attempt_no: Mapped[int] = mapped_column(Integer)
    credential_mode: Mapped[str] = mapped_column(String(32))
    provider: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    tokens_in: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    tokens_out: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    cost_usd: Mapped[Decimal] = mapped_column(Numeric(18, 8), server_default=text("0"))
    latency_ms: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    error_code: Mapped[str | None] = mapped_column(String(64))
    chunk_no: Mapped[int | None] = mapped_column(Integer)  # a chunked job's chunk; else None
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())


Index("ix_ai_usage_log_user_created", AiUsageLog.user_id, AiUsageLog.created_at)


class AiUsageDaily(Base):
    """`ai_usage_log` rolled up per UTC day, user, job type, model and credential mode, in the
    transaction that writes each usage row: budgets and the usage API read this, so their cost
    does not grow with the number of calls."""

    __tablename__ = "ai_usage_daily"
    __table_args__ = (Index("ix_ai_usage_daily_user_day", "user_id", "day"),)

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    job_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    credential_mode: Mapped[str] = mapped_column(String(32), primary_key=True)
    calls: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    tokens_in: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    tokens_out: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    cost_usd: Mapped[Decimal] = mapped_column(Numeric(20, 8), server_default=text("0"))


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


# ---- business tables written by projectors -------------------------------------------------


class SyntheticResult(Base):
    __tablename__ = "synthetic_result"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE"), unique=True
    )
    output_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())


class ProjectedRow:
    """The columns every business row a projector writes has: an id derived from (job, artifact
    type, ordinal), its job, its owner and its place in the output; one row per (job, ordinal).
    A job type's table subclasses this (or TargetedRow) and `Base`, and adds its content."""

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE")
    )
    user_id: Mapped[str] = mapped_column(String(128))
    ordinal: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())

    @declared_attr.directive
    def __table_args__(cls) -> tuple[UniqueConstraint]:
        return (UniqueConstraint("job_id", "ordinal"),)


class TargetedRow(ProjectedRow):
    """A business row that also records the job's target."""

    target_type: Mapped[str] = mapped_column(String(64))
    target_id: Mapped[str] = mapped_column(String(128))


class QuizQuestion(TargetedRow, Base):
    __tablename__ = "quiz_question"

    question: Mapped[str] = mapped_column(Text)
    choices: Mapped[list[str]] = mapped_column(JSONB)
    answer_index: Mapped[int] = mapped_column(Integer)
    explanation: Mapped[str] = mapped_column(Text)
    difficulty: Mapped[str] = mapped_column(String(16))


class Flashcard(TargetedRow, Base):
    __tablename__ = "flashcard"

    front: Mapped[str] = mapped_column(Text)
    back: Mapped[str] = mapped_column(Text)


class WeakPointCandidate(ProjectedRow, Base):
    __tablename__ = "weak_point_candidate"

    topic: Mapped[str] = mapped_column(Text)
    evidence: Mapped[list[str]] = mapped_column(JSONB)
    recommended_action: Mapped[str] = mapped_column(Text)


class ProviderGateRow(Base):
    """One row per (AI provider, key): a shared pause (429) and circuit breaker (see
    db/provider_gate)."""

    __tablename__ = "provider_gate"

    provider: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_ref: Mapped[str] = mapped_column(
        String(80), primary_key=True, server_default=text("'platform'")
    )
    paused_until: Mapped[datetime | None] = mapped_column(TS)
    consecutive_failures: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    open_until: Mapped[datetime | None] = mapped_column(TS)
    probe_until: Mapped[datetime | None] = mapped_column(TS)


class ProviderLimitRow(Base):
    """One row per (provider, model, key): token buckets for requests and tokens per minute,
    refilled at the configured (or, lower, the provider-announced) rate, shared by every
    worker (db/provider_limits.py)."""

    __tablename__ = "provider_limit"

    provider: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    key_ref: Mapped[str] = mapped_column(String(80), primary_key=True)
    requests_available: Mapped[float] = mapped_column(Float)
    tokens_available: Mapped[float] = mapped_column(Float)
    refilled_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    # What the provider's rate-limit headers announced (x-ratelimit-limit-*), and until when
    # they said nothing is left (x-ratelimit-remaining-* 0 with its reset).
    announced_rpm: Mapped[int | None] = mapped_column(Integer)
    announced_tpm: Mapped[int | None] = mapped_column(Integer)
    blocked_until: Mapped[datetime | None] = mapped_column(TS)


class ProviderCallLease(Base):
    """A provider call in flight under a concurrency limit; expires on its own if its worker
    dies, so a crash never leaks a slot."""

    __tablename__ = "provider_call_lease"
    __table_args__ = (
        Index("ix_provider_call_lease_key", "provider", "model", "key_ref", "expires_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    provider: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    key_ref: Mapped[str] = mapped_column(String(80))
    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    tokens: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    expires_at: Mapped[datetime] = mapped_column(TS)


# ---- signed webhooks -----------------------------------------------------------------------


class WebhookEndpoint(Base):
    """A user's webhook receiver. The signing secret is stored encrypted (AES-GCM, AAD bound to
    the row id); after a rotation the previous one keeps signing until `previous_valid_until`."""

    __tablename__ = "webhook_endpoint"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128), index=True)
    url: Mapped[str] = mapped_column(Text)
    event_types: Mapped[list[str]] = mapped_column(JSONB)
    key_id: Mapped[str] = mapped_column(String(64))
    secret_ciphertext: Mapped[bytes] = mapped_column(LargeBinary, info=encrypted(key_id="key_id"))
    previous_key_id: Mapped[str | None] = mapped_column(String(64))
    previous_secret_ciphertext: Mapped[bytes | None] = mapped_column(
        LargeBinary, info=encrypted(key_id="previous_key_id")
    )
    previous_valid_until: Mapped[datetime | None] = mapped_column(TS)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    deleted_at: Mapped[datetime | None] = mapped_column(TS)


class WebhookDelivery(Base):
    """One outbox domain event for one endpoint; `webhook_id` is stable across its retries."""

    __tablename__ = "webhook_delivery"
    __table_args__ = (
        UniqueConstraint("endpoint_id", "event_id"),
        CheckConstraint("status IN ('pending','delivered','failed','dead')", name="status"),
        Index(
            "ix_webhook_delivery_due",
            "next_attempt_at",
            postgresql_where=text("status IN ('pending','failed')"),
        ),
        # The fair claim walks the owners of due rows, then each owner's rows in due order.
        Index(
            "ix_webhook_delivery_user_due",
            "user_id",
            "next_attempt_at",
            postgresql_where=text("status IN ('pending','failed')"),
        ),
        # The retention purge deletes finished rows oldest first, in bounded batches.
        Index(
            "ix_webhook_delivery_finished",
            "finished_at",
            postgresql_where=text("status IN ('delivered','dead')"),
        ),
        Index("ix_webhook_delivery_status", "status", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    endpoint_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("webhook_endpoint.id", ondelete="CASCADE")
    )
    # The endpoint owner's, copied at fan-out: fairness is per user.
    user_id: Mapped[str] = mapped_column(String(128))
    # The outbox event id; no foreign key: published outbox rows are deleted by retention.
    event_id: Mapped[int] = mapped_column(BigInteger)
    job_id: Mapped[str] = mapped_column(String(64))
    webhook_id: Mapped[str] = mapped_column(String(128))
    event_type: Mapped[str] = mapped_column(String(64))
    occurred_at: Mapped[datetime] = mapped_column(TS)
    status: Mapped[str] = mapped_column(String(16), server_default=text("'pending'"))
    attempt_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    next_attempt_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    replayed_at: Mapped[datetime | None] = mapped_column(TS)
    delivered_at: Mapped[datetime | None] = mapped_column(TS)
    # When it became delivered or dead (NULL otherwise); retention counts from here.
    finished_at: Mapped[datetime | None] = mapped_column(TS)


class AdminAudit(Base):
    """One admin action (or view of internals): who, what, which target, how it ended. Written
    in the transaction of the action; `detail` holds ids, filters and counts, never job input,
    output, prompts or keys. Deleted after ADMIN_AUDIT_RETENTION_DAYS."""

    __tablename__ = "admin_audit"
    __table_args__ = (
        Index("ix_admin_audit_created", "created_at"),
        Index("ix_admin_audit_actor", "actor", "id"),
        Index("ix_admin_audit_action", "action", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    target_type: Mapped[str] = mapped_column(String(32))
    target_id: Mapped[str | None] = mapped_column(String(128))
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    outcome: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())


class BulkOperation(Base):
    """A bulk cancel or retry: its filter and the number of jobs it froze at submission."""

    __tablename__ = "bulk_operation"
    __table_args__ = (
        CheckConstraint("action IN ('cancel','retry')", name="action"),
        CheckConstraint("status IN ('running','completed')", name="status"),
        UniqueConstraint("actor", "idempotency_key"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    action: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(128))
    filter: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16), server_default=text("'running'"))
    matched: Mapped[int] = mapped_column(Integer)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    workflow_id: Mapped[str] = mapped_column(String(255))
    workflow_started_at: Mapped[datetime | None] = mapped_column(TS)
    created_at: Mapped[datetime] = mapped_column(TS, server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(TS)


class BulkOperationItem(Base):
    """One matched job of a bulk operation. `state` leaves `pending` once, by a CAS in the
    transaction that acts on the job: a retried activity finds it done and moves on."""

    __tablename__ = "bulk_operation_item"
    __table_args__ = (
        CheckConstraint("state IN ('pending','done','skipped','failed')", name="state"),
        Index(
            "ix_bulk_operation_item_pending",
            "operation_id",
            "ordinal",
            postgresql_where=text("state = 'pending'"),
        ),
        Index("ix_bulk_operation_item_job", "job_id"),
    )

    operation_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True),
        ForeignKey("bulk_operation.id", ondelete="CASCADE"),
        primary_key=True,
    )
    ordinal: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("ai_job.id", ondelete="CASCADE")
    )
    state: Mapped[str] = mapped_column(String(16), server_default=text("'pending'"))
    reason: Mapped[str | None] = mapped_column(String(64))
    result_job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    updated_at: Mapped[datetime | None] = mapped_column(TS)


# The schedules' tables live in their own module; importing it here registers them on Base.
from db import models_schedules as _models_schedules  # noqa: E402, F401
