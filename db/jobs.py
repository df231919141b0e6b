"""Reads of jobs, snapshots and artifacts, and the non-lifecycle writes of a running job
(output, progress, attempt bookkeeping). `lifecycle_status` is never written here."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from db.lifecycle import ACTIVE_SQL, TERMINAL_SQL
from db.outbox import ENQUEUE


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


# The ai_job columns a JobRow is read from: its fields, in order (the one list of them).
JOB_COLUMNS = ", ".join(f.name for f in dataclasses.fields(JobRow))

# What a list page returns: every column but the job's input and output, which can be large
# and are private (a list never shows them; JobRow keeps its shape with empty stand-ins).
LIST_COLUMNS = ", ".join(
    "'{}'::jsonb AS input"
    if f.name == "input"
    else "NULL::jsonb AS output"
    if f.name == "output"
    else f.name
    for f in dataclasses.fields(JobRow)
)


@dataclass(frozen=True)
class WaitingJob:
    """A queued job whose enqueue was published: what the reconciler checks in Temporal."""

    job_id: uuid.UUID
    workflow_id: str
    created_at: datetime
    event_id: int


@dataclass(frozen=True)
class ArtifactRef:
    artifact_type: str
    artifact_id: str
    ordinal: int


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


@dataclass(frozen=True)
class JobFilter:
    user_id: str | None = None
    job_type: str | None = None
    status: str | None = None
    queue_name: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    error_code: str | None = None


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
    ):
        if value is not None:
            where.append(f"{col} = :{col}")
            params[col] = value
    if f.created_from is not None:
        where.append("created_at >= :cf")
        params["cf"] = f.created_from
    if f.created_to is not None:
        where.append("created_at < :ct")
        params["ct"] = f.created_to
    return where, params


class JobQueries:
    async def get(self, session: AsyncSession, job_id: uuid.UUID) -> JobRow | None:
        row = (
            await session.execute(
                text(f"SELECT {JOB_COLUMNS} FROM ai_job WHERE id = :id"), {"id": job_id}
            )
        ).first()
        return JobRow(**row._mapping) if row else None

    async def get_with_snapshot(
        self, session: AsyncSession, job_id: uuid.UUID
    ) -> tuple[JobRow, dict[str, Any] | None] | None:
        """The job and its unexpired snapshot (None once expired or never stored) in one
        statement: what EXECUTE's first transaction reads after taking the job."""
        row = (
            await session.execute(
                text(
                    f"SELECT {JOB_COLUMNS}, (SELECT s.content FROM ai_job_snapshot s "
                    "WHERE s.job_id = ai_job.id AND s.expires_at > now()) AS snapshot_content "
                    "FROM ai_job WHERE id = :id"
                ),
                {"id": job_id},
            )
        ).first()
        if row is None:
            return None
        fields = dict(row._mapping)
        content = fields.pop("snapshot_content")
        return JobRow(**fields), (dict(content) if content is not None else None)

    async def get_for_update(self, session: AsyncSession, job_id: uuid.UUID) -> JobRow | None:
        """The job, its row locked (`FOR UPDATE`) until the caller's transaction ends: a
        decision taken on its state cannot race another writer of the row."""
        row = (
            await session.execute(
                text(f"SELECT {JOB_COLUMNS} FROM ai_job WHERE id = :id FOR UPDATE"),
                {"id": job_id},
            )
        ).first()
        return JobRow(**row._mapping) if row else None

    async def get_owner(self, session: AsyncSession, job_id: uuid.UUID) -> tuple[str, str] | None:
        """(job_type, user_id) of a job: what an access check needs, nothing else."""
        row = (
            await session.execute(
                text("SELECT job_type, user_id FROM ai_job WHERE id = :id"), {"id": job_id}
            )
        ).first()
        return (row.job_type, row.user_id) if row else None

    async def changed_since(
        self, session: AsyncSession, user_id: str, since_us: int, *, limit: int
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

    async def lock_state(
        self, session: AsyncSession, job_id: uuid.UUID
    ) -> tuple[str, str | None] | None:
        """A job's lifecycle status and lock holder token, or None when it does not exist."""
        row = (
            await session.execute(
                text("SELECT lifecycle_status, locked_by FROM ai_job WHERE id = :id"),
                {"id": job_id},
            )
        ).first()
        return (str(row.lifecycle_status), row.locked_by) if row else None

    async def resolve_refs(self, session: AsyncSession, job_id: uuid.UUID) -> ResolveRefs | None:
        """What RESOLVE needs, in one narrow query (no input/output JSON decoded)."""
        row = (
            await session.execute(
                text(
                    """
                    SELECT j.job_type, j.user_id, j.credential_mode, j.prompt_version,
                           j.credential_id, j.lifecycle_status, j.locked_by,
                           j.max_output_tokens,
                           EXISTS (SELECT 1 FROM ai_job_snapshot s
                                   WHERE s.job_id = j.id AND s.expires_at > now())
                               AS has_snapshot,
                           EXISTS (SELECT 1 FROM ai_job_snapshot s WHERE s.job_id = j.id)
                               AS snapshot_stored
                    FROM ai_job j WHERE j.id = :id
                    """
                ),
                {"id": job_id},
            )
        ).first()
        return ResolveRefs(**row._mapping) if row else None

    async def find_by_idempotency_key(
        self, session: AsyncSession, user_id: str, job_type: str, key: str
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

    async def artifacts(
        self, session: AsyncSession, job_ids: list[uuid.UUID]
    ) -> dict[uuid.UUID, list[ArtifactRef]]:
        out: dict[uuid.UUID, list[ArtifactRef]] = {j: [] for j in job_ids}
        if not job_ids:
            return out
        rows = await session.execute(
            text(
                "SELECT job_id, artifact_type, artifact_id, ordinal FROM ai_job_artifact "
                "WHERE job_id = ANY(:ids) ORDER BY job_id, ordinal, id"
            ),
            {"ids": job_ids},
        )
        for r in rows:
            out[r.job_id].append(ArtifactRef(r.artifact_type, r.artifact_id, r.ordinal))
        return out

    async def artifact_page(
        self,
        session: AsyncSession,
        job_id: uuid.UUID,
        *,
        after: tuple[int, int] | None,
        limit: int,
    ) -> list[tuple[int, ArtifactRef]]:
        """One page of a job's artifacts in (ordinal, id) order, after the keyset `after`;
        each with its row id (the keyset of the next page)."""
        rows = await session.execute(
            text(
                """
                SELECT id, artifact_type, artifact_id, ordinal FROM ai_job_artifact
                WHERE job_id = :j
                  AND (CAST(:ao AS integer) IS NULL OR (ordinal, id) > (:ao, CAST(:ai AS bigint)))
                ORDER BY ordinal, id LIMIT :lim
                """
            ),
            {
                "j": job_id,
                "ao": after[0] if after else None,
                "ai": after[1] if after else None,
                "lim": limit,
            },
        )
        return [(r.id, ArtifactRef(r.artifact_type, r.artifact_id, r.ordinal)) for r in rows]

    async def list_jobs(
        self,
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

    async def count_active(self, session: AsyncSession, user_id: str) -> int:
        return int(
            (
                await session.execute(
                    text(f"SELECT count(*) FROM ai_job WHERE user_id = :u AND {ACTIVE_SQL}"),
                    {"u": user_id},
                )
            ).scalar_one()
        )

    async def quota_counts(
        self,
        session: AsyncSession,
        user_id: str,
        *,
        active: bool,
        day: datetime | None,
        month: datetime | None,
    ) -> tuple[int, int, int]:
        """(active jobs, created since `day`, created since `month`) of a user in one round
        trip; a count not asked for (False / None) is 0 and not computed. Each count is
        served by its index (the active partial index; (user_id, created_at))."""
        parts = [
            f"(SELECT count(*) FROM ai_job WHERE user_id = :u AND {ACTIVE_SQL})" if active else "0",
            "(SELECT count(*) FROM ai_job WHERE user_id = :u AND created_at >= :day)"
            if day is not None
            else "0",
            "(SELECT count(*) FROM ai_job WHERE user_id = :u AND created_at >= :month)"
            if month is not None
            else "0",
        ]
        row = (
            await session.execute(
                text(f"SELECT {', '.join(parts)}"), {"u": user_id, "day": day, "month": month}
            )
        ).one()
        return int(row[0]), int(row[1]), int(row[2])

    async def count_created_since(
        self, session: AsyncSession, user_id: str, since: datetime
    ) -> int:
        """Jobs a user created since `since` (a UTC day or month start from the caller)."""
        return int(
            (
                await session.execute(
                    text("SELECT count(*) FROM ai_job WHERE user_id = :u AND created_at >= :since"),
                    {"u": user_id, "since": since},
                )
            ).scalar_one()
        )

    async def find_retry_of(self, session: AsyncSession, job_id: uuid.UUID) -> JobRow | None:
        row = (
            await session.execute(
                text(f"SELECT {JOB_COLUMNS} FROM ai_job WHERE retried_from_job_id = :id"),
                {"id": job_id},
            )
        ).first()
        return JobRow(**row._mapping) if row else None

    # ---- snapshots ----------------------------------------------------------------------

    async def insert_snapshot(
        self,
        session: AsyncSession,
        job_id: uuid.UUID,
        content: dict[str, Any],
        redaction_version: str,
        ttl_days: int,
    ) -> None:
        await session.execute(
            text(
                """
                INSERT INTO ai_job_snapshot (job_id, content, redaction_version, expires_at,
                                             created_at)
                VALUES (:id, :c, :rv, now() + make_interval(days => :ttl), now())
                """
            ).bindparams(bindparam("c", type_=JSONB)),
            {"id": job_id, "c": content, "rv": redaction_version, "ttl": ttl_days},
        )

    async def get_snapshot(self, session: AsyncSession, job_id: uuid.UUID) -> dict[str, Any] | None:
        row = (
            await session.execute(
                text(
                    "SELECT content FROM ai_job_snapshot WHERE job_id = :id AND expires_at > now()"
                ),
                {"id": job_id},
            )
        ).first()
        return dict(row.content) if row else None

    async def purge_private_data(
        self, session: AsyncSession, *, retention_days: int, limit: int = 1000
    ) -> int:
        """The retention rule for the job row's copies of private data: a terminal job created
        more than `retention_days` ago keeps its status, codes, hashes and artifacts, but its
        input and validated output are removed (snapshots expire on the same clock)."""
        result = await session.execute(
            text(
                f"""
                UPDATE ai_job SET input = '{{}}'::jsonb, output = NULL,
                       private_data_purged_at = now(), updated_at = now()
                WHERE id IN (
                    SELECT id FROM ai_job
                    WHERE private_data_purged_at IS NULL
                      AND {TERMINAL_SQL}
                      AND created_at < now() - make_interval(days => :d)
                    ORDER BY created_at LIMIT :lim)
                """
            ),
            {"d": retention_days, "lim": limit},
        )
        return int(result.rowcount)  # type: ignore[attr-defined]

    async def delete_expired_snapshots(self, session: AsyncSession, *, limit: int = 1000) -> int:
        result = await session.execute(
            text(
                """
                DELETE FROM ai_job_snapshot WHERE job_id IN (
                    SELECT job_id FROM ai_job_snapshot WHERE expires_at <= now() LIMIT :lim)
                """
            ),
            {"lim": limit},
        )
        return int(result.rowcount)  # type: ignore[attr-defined]

    # ---- running-job bookkeeping (never lifecycle) -------------------------------------

    async def store_output(
        self,
        session: AsyncSession,
        job_id: uuid.UUID,
        *,
        owner: str,
        output: dict[str, Any],
        output_hash: str,
        progress: int,
    ) -> bool:
        """Only the lock owner of a running job may store an output. Progress changes, so the
        job's listeners are notified (`ai_job_changed`, in this transaction)."""
        result = await session.execute(
            text(
                """
                UPDATE ai_job SET output = :out, output_hash = :h,
                       progress = greatest(progress, :p), updated_at = now()
                WHERE id = :id AND lifecycle_status = 'running'
                  AND split_part(locked_by, '/', 1) = :owner
                RETURNING pg_notify('ai_job_changed', id::text) IS NULL AS notified
                """
            ).bindparams(bindparam("out", type_=JSONB)),
            {"id": job_id, "out": output, "h": output_hash, "p": progress, "owner": owner},
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def settle_attempt(
        self,
        session: AsyncSession,
        job_id: uuid.UUID,
        *,
        owner: str,
        attempt: int,
        ttl_s: int,
        output: dict[str, Any],
        output_hash: str,
        progress: int,
    ) -> tuple[bool, bool]:
        """EXECUTE's bookkeeping after a valid answer, in one UPDATE of the row: the attempt is
        recorded (its correction hint cleared) whoever holds the job; while `owner` holds it
        running, its lock is extended and, unless a cancel was asked for, the output stored
        (listeners notified). The same as `record_attempt`, `LifecycleRepository.extend_lock`
        and `store_output` in that order, in one round trip. Returns (owned, cancel_requested);
        the output was stored when owned and no cancel was requested."""
        row = (
            await session.execute(
                text(
                    """
                    WITH cur AS (
                        SELECT id, (lifecycle_status = 'running'
                                    AND split_part(locked_by, '/', 1) = :owner) AS owned,
                               cancel_requested_at IS NOT NULL AS cancel_requested
                        FROM ai_job WHERE id = :id FOR UPDATE
                    )
                    UPDATE ai_job SET
                        attempt_count = greatest(attempt_count, :a),
                        correction_hint = NULL,
                        lock_until = CASE WHEN cur.owned
                            THEN now() + make_interval(secs => :ttl) ELSE lock_until END,
                        output = CASE WHEN cur.owned AND NOT cur.cancel_requested
                            THEN :out ELSE output END,
                        output_hash = CASE WHEN cur.owned AND NOT cur.cancel_requested
                            THEN :h ELSE output_hash END,
                        progress = CASE WHEN cur.owned AND NOT cur.cancel_requested
                            THEN greatest(progress, :p) ELSE progress END,
                        updated_at = now()
                    FROM cur
                    WHERE ai_job.id = cur.id
                    RETURNING cur.owned, cur.cancel_requested,
                        CASE WHEN cur.owned AND NOT cur.cancel_requested
                            THEN pg_notify('ai_job_changed', ai_job.id::text) IS NULL
                        END AS notified
                    """
                ).bindparams(bindparam("out", type_=JSONB)),
                {
                    "id": job_id,
                    "owner": owner,
                    "a": attempt,
                    "ttl": ttl_s,
                    "out": output,
                    "h": output_hash,
                    "p": progress,
                },
            )
        ).first()
        if row is None:
            return False, False
        return bool(row.owned), bool(row.cancel_requested)

    async def record_attempt(
        self,
        session: AsyncSession,
        job_id: uuid.UUID,
        *,
        attempt: int,
        internal_error: str | None,
        correction_hint: str | None = None,
    ) -> None:
        """An attempt's bookkeeping; `correction_hint` is what the next attempt's prompt is told
        was wrong with this one (None clears it)."""
        await session.execute(
            text(
                """
                UPDATE ai_job SET attempt_count = greatest(attempt_count, :a),
                       internal_error_message = coalesce(:e, internal_error_message),
                       correction_hint = :c, updated_at = now()
                WHERE id = :id
                """
            ),
            {"id": job_id, "a": attempt, "e": internal_error, "c": correction_hint},
        )

    async def insert_artifact(
        self,
        session: AsyncSession,
        job_id: uuid.UUID,
        artifact_type: str,
        artifact_id: str,
        ordinal: int,
    ) -> bool:
        """Idempotent on (job_id, artifact_type, artifact_id): a duplicate projection is a no-op."""
        row = (
            await session.execute(
                text(
                    """
                    INSERT INTO ai_job_artifact (job_id, artifact_type, artifact_id, ordinal,
                                                 created_at)
                    VALUES (:j, :t, :a, :o, now())
                    ON CONFLICT (job_id, artifact_type, artifact_id) DO NOTHING
                    RETURNING id
                    """
                ),
                {"j": job_id, "t": artifact_type, "a": artifact_id, "o": ordinal},
            )
        ).first()
        return row is not None

    async def published_enqueues_of_queued_jobs(
        self, session: AsyncSession, *, older_than_s: float, after_id: int = 0, limit: int = 100
    ) -> list[tuple[int, uuid.UUID, str]]:
        """Reconciler: enqueue events marked published while their job is still queued, paged by
        event id."""
        rows = await session.execute(
            text(
                """
                SELECT o.id AS event_id, j.id AS job_id, j.workflow_id
                FROM outbox_event o JOIN ai_job j ON j.id::text = o.aggregate_id
                WHERE o.event_type = :enqueue AND o.status = 'published'
                  AND j.lifecycle_status = 'queued'
                  AND o.published_at < now() - make_interval(secs => :age)
                  AND o.id > :after
                ORDER BY o.id LIMIT :lim
                """
            ),
            {"age": older_than_s, "lim": limit, "after": after_id, "enqueue": ENQUEUE},
        )
        return [(r.event_id, r.job_id, r.workflow_id) for r in rows]

    async def waiting_jobs_page(
        self,
        session: AsyncSession,
        *,
        published_before_s: float,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[WaitingJob]:
        """Reconciler: `queued` jobs whose enqueue was published more than `published_before_s`
        ago (so their workflow should exist and be visible by now), in (created_at, id) order
        after the keyset `after`. Driven by `ix_ai_job_status_created` over queued jobs only,
        then the job's enqueue row by `aggregate_id`: a page costs the same however many
        published rows of finished jobs the outbox still keeps."""
        rows = await session.execute(
            text(
                """
                SELECT j.id AS job_id, j.workflow_id, j.created_at, o.id AS event_id
                FROM ai_job j
                JOIN outbox_event o ON o.aggregate_id = j.id::text AND o.event_type = :enqueue
                WHERE j.lifecycle_status = 'queued'
                  AND (CAST(:ac AS timestamptz) IS NULL
                       OR (j.created_at, j.id) > (CAST(:ac AS timestamptz), CAST(:ai AS uuid)))
                  AND o.status = 'published'
                  AND o.published_at < now() - make_interval(secs => :age)
                ORDER BY j.created_at, j.id LIMIT :lim
                """
            ),
            {
                "enqueue": ENQUEUE,
                "age": published_before_s,
                "ac": after[0] if after else None,
                "ai": after[1] if after else None,
                "lim": limit,
            },
        )
        return [WaitingJob(**r._mapping) for r in rows]

    async def cancel_requested_page(
        self,
        session: AsyncSession,
        *,
        older_than_s: float,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[tuple[uuid.UUID, str, datetime]]:
        """Reconciler: running jobs with a cancel request older than `older_than_s`, in
        (cancel_requested_at, id) order after the keyset `after`: (job id, workflow id,
        cancel_requested_at)."""
        rows = await session.execute(
            text(
                """
                SELECT id, workflow_id, cancel_requested_at FROM ai_job
                WHERE lifecycle_status = 'running' AND cancel_requested_at IS NOT NULL
                  AND cancel_requested_at < now() - make_interval(secs => :age)
                  AND (CAST(:ac AS timestamptz) IS NULL
                       OR (cancel_requested_at, id) > (CAST(:ac AS timestamptz),
                                                       CAST(:ai AS uuid)))
                ORDER BY cancel_requested_at, id LIMIT :lim
                """
            ),
            {
                "age": older_than_s,
                "ac": after[0] if after else None,
                "ai": after[1] if after else None,
                "lim": limit,
            },
        )
        return [(r.id, r.workflow_id, r.cancel_requested_at) for r in rows]

    async def running_with_cancel_requested(
        self, session: AsyncSession, *, older_than_s: float, limit: int = 100
    ) -> list[tuple[uuid.UUID, str]]:
        rows = await session.execute(
            text(
                """
                SELECT id, workflow_id FROM ai_job
                WHERE lifecycle_status = 'running' AND cancel_requested_at IS NOT NULL
                  AND cancel_requested_at < now() - make_interval(secs => :age)
                ORDER BY cancel_requested_at LIMIT :lim
                """
            ),
            {"age": older_than_s, "lim": limit},
        )
        return [(r.id, r.workflow_id) for r in rows]
