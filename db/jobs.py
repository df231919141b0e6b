"""Reads of `ai_job`: one job (plain, with its snapshot, locked, its owner), pages and filters,
the event streams' resume read, the idempotency lookup. Nothing here writes; a job row's writes
live in db/lifecycle.py, the quota counts in db/budgets.py `standing` (with the spend and
reservations they are decided with). Every function runs in the caller's session."""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.artifacts import ArtifactRef


@dataclass(frozen=True)
class JobRow:
    id: uuid.UUID
    user_id: str
    job_type: str
    target_type: str
    target_id: str
    idempotency_key: str | None
    request_fingerprint: str
    lifecycle_status: str
    status: str
    queue_name: str
    priority: int
    progress: int
    input: dict[str, Any]
    credential_mode: str
    credential_id: uuid.UUID | None
    prompt_version: str
    input_schema_version: str
    output_schema_version: str
    attempt_count: int
    max_retry_count: int
    locked_by: str | None
    locked_at: datetime | None
    lock_until: datetime | None
    cancel_requested_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    error_code: str | None
    public_error_message: str | None
    internal_error_message: str | None
    output: dict[str, Any] | None
    output_hash: str | None
    workflow_id: str
    retried_from_job_id: uuid.UUID | None
    created_at: datetime
    updated_at: datetime
    private_data_purged_at: datetime | None = None
    correction_hint: str | None = None
    # Tokens and money, fixed at create (None/0 on jobs created before they were).
    estimated_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_cost_usd: Decimal | None = None
    reserved_cost_usd: Decimal = Decimal(0)
    spent_cost_usd: Decimal = Decimal(0)
    chunk_count: int | None = None  # a long source's chunks (db/chunks.py); None: one call
    # The client's own references (`{}`: none) and when a delayed job may start (None: at once).
    metadata: dict[str, str] = field(default_factory=dict)
    run_at: datetime | None = None
    # Its service tier (engine/tiers.py), an off-peak deadline and policy, result reuse.
    service_tier: str = "standard"
    offpeak_deadline_at: datetime | None = None
    offpeak_on_deadline: str | None = None
    reuse_allowed: bool = False
    reused_from_job_id: uuid.UUID | None = None
    # Its organisation, teams and tags (engine/scopes.py), fixed at create.
    org_id: str | None = None
    team_ids: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    # Its rollout and arm (NULL outside one) and the arm's model; the output items moderation
    # dropped (NULL: none ran); an answer held while moderation was away (private).
    rollout_id: uuid.UUID | None = None
    rollout_arm: str | None = None
    arm_model: str | None = None
    flagged_items: int | None = None
    held_answer: str | None = None
    # Flow control (engine/flow.py): the create's `concurrency` as given and its key, a debounce
    # chain's latest start, the job that replaced this one, the start-by time, the deadline and
    # the code a requested cancel ends it with.
    concurrency: dict[str, Any] | None = None
    concurrency_key: str | None = None
    debounce_until: datetime | None = None
    superseded_by: uuid.UUID | None = None
    expires_at: datetime | None = None
    deadline_at: datetime | None = None
    cancel_code: str | None = None


# The ai_job columns a JobRow is read from: its fields, in order (the one list of them).
JOB_COLUMNS = ", ".join(f.name for f in dataclasses.fields(JobRow))

# What a list page returns: every column but the job's input and output, which can be large
# and are private (a list never shows them; JobRow keeps its shape with empty stand-ins).
LIST_COLUMNS = ", ".join(
    "'{}'::jsonb AS input"
    if f.name == "input"
    else "NULL::jsonb AS output"
    if f.name == "output"
    else "NULL::text AS held_answer"
    if f.name == "held_answer"
    else f.name
    for f in dataclasses.fields(JobRow)
)


@dataclass(frozen=True)
class JobStatusRow:
    """What a job's public view (jobs/views.py) is built from, and its owner: the columns of
    `GET /api/ai/jobs/{id}`, without the input and output JSON a JobRow carries."""

    id: uuid.UUID
    user_id: str
    job_type: str
    lifecycle_status: str
    queue_name: str
    priority: int
    progress: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error_code: str | None
    public_error_message: str | None
    chunk_count: int | None
    target_type: str
    target_id: str
    metadata: dict[str, str]
    run_at: datetime | None
    prompt_version: str
    output_schema_version: str
    private_data_purged_at: datetime | None = None
    service_tier: str = "standard"
    reused_from_job_id: uuid.UUID | None = None
    tags: list[str] = field(default_factory=list)
    rollout_arm: str | None = None
    flagged_items: int | None = None
    concurrency: dict[str, Any] | None = None
    superseded_by: uuid.UUID | None = None
    expires_at: datetime | None = None
    deadline_at: datetime | None = None


_STATUS_COLUMNS = ", ".join(f"j.{f.name}" for f in dataclasses.fields(JobStatusRow))
# One round trip for a job and its artifacts, in `artifacts`' order (ordinal, id).
# The model of a succeeded job's latest successful call: what produced its output.
# The model of a succeeded job's latest successful call (a reused job's: its source's): what
# produced its output, and the structured-output form that call asked for.
ANSWERING_CALL = (
    "SELECT u.model, u.structured_output FROM ai_usage_log u "
    "WHERE u.job_id = coalesce(j.reused_from_job_id, j.id) AND u.error_code IS NULL "
    "ORDER BY u.created_at DESC, u.id DESC LIMIT 1"
)
_STATUS_WITH_ARTIFACTS = text(
    f"SELECT {_STATUS_COLUMNS}, a.refs AS artifact_refs, "
    "CASE WHEN j.lifecycle_status = 'succeeded' THEN c.model END AS answered_model, "
    "CASE WHEN j.lifecycle_status = 'succeeded' THEN c.structured_output END "
    "AS answered_form "
    "FROM ai_job j LEFT JOIN LATERAL "
    "(SELECT json_agg(json_build_array(artifact_type, artifact_id, ordinal) "
    "ORDER BY ordinal, id) AS refs FROM ai_job_artifact WHERE job_id = j.id) a ON TRUE "
    f"LEFT JOIN LATERAL ({ANSWERING_CALL}) c ON j.lifecycle_status = 'succeeded' "
    "WHERE j.id = :id"
)


@dataclass(frozen=True)
class Answered:
    """What answered a succeeded job: the model (as the provider named it) and the
    structured-output form it was asked in (None: not known)."""

    model: str | None = None
    structured_output: str | None = None


async def status_with_artifacts(
    session: AsyncSession, job_id: uuid.UUID
) -> tuple[JobStatusRow, list[ArtifactRef], Answered] | None:
    """A job's public columns and owner, its artifacts (what `db.artifacts.artifacts` reads for
    it) and, once it succeeded, the model that answered and its form, in one statement; None
    when the job does not exist."""
    row = (await session.execute(_STATUS_WITH_ARTIFACTS, {"id": job_id})).first()
    if row is None:
        return None
    fields = dict(row._mapping)
    refs = fields.pop("artifact_refs") or []
    answered = Answered(fields.pop("answered_model"), fields.pop("answered_form"))
    return JobStatusRow(**fields), [ArtifactRef(t, i, o) for t, i, o in refs], answered


@dataclass(frozen=True)
class ResolveRefs:
    job_type: str
    user_id: str
    credential_mode: str
    prompt_version: str
    has_snapshot: bool  # present and not expired
    credential_id: uuid.UUID | None = None
    snapshot_stored: bool = True  # present, expired or not
    lifecycle_status: str = "queued"
    locked_by: str | None = None
    max_output_tokens: int | None = None  # fixed at create; None on older jobs
    reused_from_job_id: uuid.UUID | None = None  # the job whose answer it reuses
    # An off-peak job's tier, deadline and policy there (RESOLVE's hold, jobs/offpeak.py).
    service_tier: str = "standard"
    offpeak_deadline_at: datetime | None = None
    offpeak_on_deadline: str | None = None
    # The output schema version it was created with (RESOLVE checks both are still published).
    output_schema_version: str = ""


@dataclass(frozen=True)
class JobFilter:
    user_id: str | None = None
    job_type: str | None = None
    status: str | None = None
    queue_name: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    error_code: str | None = None
    target_type: str | None = None
    target_id: str | None = None
    # (key, value) pairs the job's metadata must all hold (`metadata.<key>=<value>`).
    metadata: tuple[tuple[str, str], ...] = ()


def filter_sql(f: JobFilter) -> tuple[list[str], dict[str, Any]]:
    """The WHERE conditions and parameters of a JobFilter: the admin list, the bulk operations'
    dry run and their frozen item lists select the same jobs for the same filter."""
    where = ["TRUE"]
    params: dict[str, Any] = {}
    for col, value in (
        ("user_id", f.user_id),
        ("job_type", f.job_type),
        ("lifecycle_status", f.status),
        ("queue_name", f.queue_name),
        ("error_code", f.error_code),
        ("target_type", f.target_type),
        ("target_id", f.target_id),
    ):
        if value is not None:
            where.append(f"{col} = :{col}")
            params[col] = value
    for i, (key, value) in enumerate(f.metadata):
        # One containment test per pair, each served by the GIN index (jsonb_path_ops) on
        # metadata: a key given twice with two values matches no job, as "all must match" says.
        where.append(f"metadata @> CAST(:md{i} AS jsonb)")
        params[f"md{i}"] = json.dumps({key: value})
    if f.created_from is not None:
        where.append("created_at >= :cf")
        params["cf"] = f.created_from
    if f.created_to is not None:
        where.append("created_at < :ct")
        params["ct"] = f.created_to
    return where, params


GET = text(f"SELECT {JOB_COLUMNS} FROM ai_job WHERE id = :id")


async def get(session: AsyncSession, job_id: uuid.UUID) -> JobRow | None:
    row = (await session.execute(GET, {"id": job_id})).first()
    return JobRow(**row._mapping) if row else None


async def stored_output(session: AsyncSession, job_id: uuid.UUID) -> dict[str, Any] | None:
    """The job's validated output as stored: what the default artifact view shows (None before
    it is stored, once retention purged it, or when the job does not exist)."""
    output = await session.scalar(text("SELECT output FROM ai_job WHERE id = :id"), {"id": job_id})
    return dict(output) if output is not None else None


def row_of(rows: list[dict[str, Any]]) -> JobRow | None:
    """`GET`'s rows (pipelined) as the job, or None when it is gone."""
    return JobRow(**rows[0]) if rows else None


GET_WITH_SNAPSHOT = text(
    f"SELECT {JOB_COLUMNS}, (SELECT s.content FROM ai_job_snapshot s "
    "WHERE s.job_id = ai_job.id AND s.expires_at > now()) AS snapshot_content "
    "FROM ai_job WHERE id = :id"
)


def with_snapshot_of(
    row: dict[str, Any] | None,
) -> tuple[JobRow, dict[str, Any] | None] | None:
    """`GET_WITH_SNAPSHOT`'s row as (the job, its snapshot's content or None)."""
    if row is None:
        return None
    fields = dict(row)
    content = fields.pop("snapshot_content")
    return JobRow(**fields), (dict(content) if content is not None else None)


async def get_for_update(session: AsyncSession, job_id: uuid.UUID) -> JobRow | None:
    """The job, its row locked (`FOR UPDATE`) until the caller's transaction ends: a
    decision taken on its state cannot race another writer of the row."""
    row = (
        await session.execute(
            text(f"SELECT {JOB_COLUMNS} FROM ai_job WHERE id = :id FOR UPDATE"),
            {"id": job_id},
        )
    ).first()
    return JobRow(**row._mapping) if row else None


async def get_owner(session: AsyncSession, job_id: uuid.UUID) -> tuple[str, str] | None:
    """(job_type, user_id) of a job: what an access check needs, nothing else."""
    row = (
        await session.execute(
            text("SELECT job_type, user_id FROM ai_job WHERE id = :id"), {"id": job_id}
        )
    ).first()
    return (row.job_type, row.user_id) if row else None


async def changed_since(
    session: AsyncSession, user_id: str, since_us: int, *, limit: int
) -> list[uuid.UUID]:
    """A user's jobs updated after `since_us` (microseconds since the epoch), oldest change
    first: what an event stream re-reads after it may have missed notifications."""
    rows = await session.execute(
        text(
            "SELECT id FROM ai_job WHERE user_id = :u "
            "AND updated_at > to_timestamp(:since / 1000000.0) "
            "ORDER BY updated_at LIMIT :lim"
        ),
        {"u": user_id, "since": since_us, "lim": limit},
    )
    return [r.id for r in rows]


# RESOLVE's hot read, also run pipelined on the driver connection (db/pipeline.py).
RESOLVE_REFS = text(
    """
    SELECT j.job_type, j.user_id, j.credential_mode, j.prompt_version, j.output_schema_version,
           j.credential_id, j.lifecycle_status, j.locked_by,
           j.max_output_tokens, j.reused_from_job_id, j.service_tier, j.offpeak_deadline_at,
           j.offpeak_on_deadline,
           EXISTS (SELECT 1 FROM ai_job_snapshot s
                   WHERE s.job_id = j.id AND s.expires_at > now())
               AS has_snapshot,
           EXISTS (SELECT 1 FROM ai_job_snapshot s WHERE s.job_id = j.id)
               AS snapshot_stored
    FROM ai_job j WHERE j.id = :id
    """
)


async def find_by_idempotency_key(
    session: AsyncSession, user_id: str, job_type: str, key: str
) -> JobRow | None:
    row = (
        await session.execute(
            text(
                f"SELECT {JOB_COLUMNS} FROM ai_job "
                "WHERE user_id = :u AND job_type = :t AND idempotency_key = :k"
            ),
            {"u": user_id, "t": job_type, "k": key},
        )
    ).first()
    return JobRow(**row._mapping) if row else None


async def list_jobs(
    session: AsyncSession,
    f: JobFilter,
    *,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[JobRow]:
    """Newest first; keyset pagination on (created_at, id) is stable under inserts. Each
    filter has an index on (filter, created_at, id) (a user's own list: (user_id, filter,
    created_at, id)), so a page costs the same at any table size. Input and output are not
    read."""
    where, params = filter_sql(f)
    params["lim"] = limit
    if after is not None:
        where.append("(created_at, id) < (:ac, :ai)")
        params["ac"], params["ai"] = after
    rows = await session.execute(
        text(
            f"SELECT {LIST_COLUMNS} FROM ai_job WHERE {' AND '.join(where)} "
            "ORDER BY created_at DESC, id DESC LIMIT :lim"
        ),
        params,
    )
    return [JobRow(**r._mapping) for r in rows]


async def find_retry_of(session: AsyncSession, job_id: uuid.UUID) -> JobRow | None:
    row = (
        await session.execute(
            text(f"SELECT {JOB_COLUMNS} FROM ai_job WHERE retried_from_job_id = :id"),
            {"id": job_id},
        )
    ).first()
    return JobRow(**row._mapping) if row else None
