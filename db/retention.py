"""Retention: what the engine keeps, for how long, and the one purge of a job's private data.

A job's private data is every copy of what its user wrote or its provider answered: the input,
the validated output, the business rows its projector wrote from it (quiz questions,
flashcards, weak-point candidates: every table of db/models/projected.py built on
`ProjectedRow`), each chunk's output (the partial items of a long source), an answer held for
moderation (the job's or a chunk's), the items it streamed, its batch line's body and answer,
the snapshot, the internal error message (it may quote a provider's answer) with the correction
hint sent back to the provider, and the comment of the job's feedback. `purge_jobs` removes all
of them in one statement and marks the row `private_data_purged_at`; the lifecycle row (status,
codes, hashes, times, costs), its usage rows and its artifact references stay, for billing and
audit (the artifacts API lists those references with `content: null`).
Retention (`purge_private_data`) and the owner's `DELETE /api/ai/jobs/{jobId}` both call it,
so "purged" means the same wherever it happens. A batch's copies at the provider (its input,
output and error files) become due for deletion once every job of the batch is purged and none
waits for it (db/batch_files.py); the reconciler's retention phase deletes them there.

The other purges delete rows that only the engine's bookkeeping needs, each after its own
retention (docs/operations.md "Retention"), a bounded page per call so a pass never holds long
locks: usage rows (never the current month's rollup, which budgets read), provider rate-limit
buckets and gates idle that long, expired call leases, parked (`dead`, `failed`) outbox rows,
and revoked credentials (deleted when no job names them, else their ciphertext erased).

Every function runs in the caller's session and never commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.lifecycle import TERMINAL_SQL
from db.models import projected


def _projected_tables() -> tuple[str, ...]:
    """The business tables of the job types' projectors: each model of db/models/projected.py
    built on `ProjectedRow` (one row per (job, ordinal), `job_id` indexed by its unique key)."""
    names = (
        getattr(cls, "__tablename__", None)
        for cls in vars(projected).values()
        if isinstance(cls, type)
        and issubclass(cls, projected.ProjectedRow)
        and cls.__module__ == projected.__name__
    )
    return tuple(sorted(n for n in names if isinstance(n, str)))


PROJECTED_TABLES = _projected_tables()
# One data-modifying WITH per business table: its rows of the target jobs deleted.
_PURGE_PROJECTED = "".join(
    f"""
    projected_{n} AS (
        DELETE FROM {table} p USING target t WHERE p.job_id = t.id
        RETURNING p.job_id
    ),"""
    for n, table in enumerate(PROJECTED_TABLES)
)
_PROJECTED_COUNT = (
    " + ".join(f"(SELECT count(*) FROM projected_{n})" for n in range(len(PROJECTED_TABLES))) or "0"
)

# The purge of the terminal, not yet purged jobs among `:ids`: the job row's copies, its
# business rows, its chunks' outputs, its streamed items, its batch lines and its snapshot, in
# one statement (data-modifying WITHs see the same snapshot, and commit or roll back together).
# The batches a purged job's line went in are not touched here: once every job of a batch is
# purged, the batch's files at the provider are due (db/batch_files.py), whichever path purged
# the last of them.
_PURGE_JOBS = text(
    f"""
    WITH target AS (
        SELECT id FROM ai_job
        WHERE id = ANY(:ids) AND private_data_purged_at IS NULL AND {TERMINAL_SQL}
    ),
    jobs AS (
        UPDATE ai_job j SET input = '{{}}'::jsonb, output = NULL,
               internal_error_message = NULL, correction_hint = NULL, held_answer = NULL,
               private_data_purged_at = now(), updated_at = now()
        FROM target t WHERE j.id = t.id
        RETURNING j.id
    ),{_PURGE_PROJECTED}
    chunks AS (
        UPDATE ai_job_chunk c SET output = NULL, held_answer = NULL
        FROM target t WHERE c.job_id = t.id
          AND (c.output IS NOT NULL OR c.held_answer IS NOT NULL)
        RETURNING c.job_id
    ),
    feedback AS (
        UPDATE ai_job_feedback f SET comment = NULL
        FROM target t WHERE f.job_id = t.id AND f.comment IS NOT NULL
        RETURNING f.job_id
    ),
    snapshots AS (
        DELETE FROM ai_job_snapshot n USING target t WHERE n.job_id = t.id
        RETURNING n.job_id
    ),
    streamed AS (
        DELETE FROM ai_job_stream_item i USING target t WHERE i.job_id = t.id
        RETURNING i.job_id
    ),
    batch_items AS (
        UPDATE ai_batch_item b SET body = '{{}}'::jsonb, response = NULL
        FROM target t WHERE b.job_id = t.id AND (b.body <> '{{}}'::jsonb OR b.response IS NOT NULL)
        RETURNING b.job_id
    )
    SELECT (SELECT count(*) FROM jobs) AS purged,
           {_PROJECTED_COUNT} AS projected_rows,
           (SELECT count(*) FROM batch_items) AS batch_items,
           (SELECT count(*) FROM streamed) AS streamed_items,
           (SELECT count(*) FROM chunks) AS chunks,
           (SELECT count(*) FROM feedback) AS feedback_comments,
           (SELECT count(*) FROM snapshots) AS snapshots
    """
)


async def purge_jobs(session: AsyncSession, job_ids: Sequence[uuid.UUID]) -> int:
    """Purge the private data of those of `job_ids` that are terminal and not purged yet;
    returns how many were purged. A job that is not terminal is left alone (a running job still
    needs its input); a purged one is not touched again (idempotent)."""
    if not job_ids:
        return 0
    row = (await session.execute(_PURGE_JOBS, {"ids": list(job_ids)})).one()
    return int(row.purged)


async def purge_private_data(
    session: AsyncSession, *, retention_days: int, limit: int = 1000
) -> int:
    """Retention of private data: the terminal jobs created more than `retention_days` ago
    (oldest first, at most `limit`; the partial index `ix_ai_job_retention` serves the page)
    are purged by `purge_jobs`. Snapshots expire on the same clock (`expires_at`)."""
    ids = (
        await session.scalars(
            text(
                f"""
                SELECT id FROM ai_job
                WHERE private_data_purged_at IS NULL AND {TERMINAL_SQL}
                  AND created_at < now() - make_interval(days => :d)
                ORDER BY created_at LIMIT :lim
                """
            ),
            {"d": retention_days, "lim": limit},
        )
    ).all()
    return await purge_jobs(session, list(ids))


async def _deleted(session: AsyncSession, sql: str, params: dict[str, object]) -> int:
    result = await session.execute(text(sql), params)
    return int(result.rowcount)  # type: ignore[attr-defined]


async def purge_usage(session: AsyncSession, *, days: float, limit: int = 5000) -> int:
    """Usage rows older than `days`: the per-call rows by `created_at`, then the daily rollups by
    their day (the user's, the scoped jobs', each scope's) and the budget alerts sent by their
    period's start, except the current month's (the longest budget window reads it). Returns
    the rows deleted together."""
    calls = await _deleted(
        session,
        """
        DELETE FROM ai_usage_log WHERE id IN (
            SELECT id FROM ai_usage_log
            WHERE created_at < now() - make_interval(secs => :s)
            ORDER BY created_at LIMIT :lim)
        """,
        {"s": days * 86_400, "lim": limit},
    )
    daily = await _deleted(
        session,
        """
        DELETE FROM ai_usage_daily WHERE (day, user_id, job_type, model, credential_mode) IN (
            SELECT day, user_id, job_type, model, credential_mode FROM ai_usage_daily
            WHERE day < (now() AT TIME ZONE 'UTC' - make_interval(secs => :s))::date
              AND day < date_trunc('month', now() AT TIME ZONE 'UTC')::date
            ORDER BY day LIMIT :lim)
        """,
        {"s": days * 86_400, "lim": limit},
    )
    scoped = 0
    # The rollups by scope and the alerts sent go by the same rule (db/models/budgets.py).
    for table, key, day in _SCOPED_ROLLUPS:
        scoped += await _deleted(
            session,
            f"""
            DELETE FROM {table} WHERE ({key}) IN (
                SELECT {key} FROM {table}
                WHERE {day} < (now() AT TIME ZONE 'UTC' - make_interval(secs => :s))::date
                  AND {day} < date_trunc('month', now() AT TIME ZONE 'UTC')::date
                ORDER BY {day} LIMIT :lim)
            """,
            {"s": days * 86_400, "lim": limit},
        )
    return calls + daily + scoped


# Table, key columns, day column: constants spliced into `purge_usage`'s statement.
_SCOPED_ROLLUPS = (
    (
        "ai_usage_scoped_daily",
        "day, user_id, job_type, model, credential_mode, scope_key",
        "day",
    ),
    ("ai_scope_usage_daily", "scope, scope_id, day", "day"),
    ("ai_budget_alert", "scope, scope_id, period, period_start, threshold", "period_start"),
)


async def purge_provider_limits(session: AsyncSession, *, days: float, limit: int = 5000) -> int:
    """Rate-limit buckets of a (provider, model, key) not used for `days` (not refilled, not
    blocked): a full bucket is what the next call would create again."""
    return await _deleted(
        session,
        """
        DELETE FROM provider_limit WHERE (provider, model, key_ref) IN (
            SELECT provider, model, key_ref FROM provider_limit
            WHERE refilled_at < now() - make_interval(secs => :s)
              AND (blocked_until IS NULL OR blocked_until < now() - make_interval(secs => :s))
            LIMIT :lim)
        """,
        {"s": days * 86_400, "lim": limit},
    )


async def purge_provider_gates(session: AsyncSession, *, days: float, limit: int = 5000) -> int:
    """Gates of a (provider, key) whose every pause, breaker and probe ended more than `days`
    ago (or never began): a closed gate is what the next failure would create again."""
    return await _deleted(
        session,
        """
        DELETE FROM provider_gate WHERE (provider, key_ref) IN (
            SELECT provider, key_ref FROM provider_gate
            WHERE coalesce(greatest(paused_until, open_until, probe_until), '-infinity')
                  < now() - make_interval(secs => :s)
              AND (consecutive_failures = 0
                   OR greatest(paused_until, open_until, probe_until) IS NOT NULL)
            LIMIT :lim)
        """,
        {"s": days * 86_400, "lim": limit},
    )


async def purge_call_leases(session: AsyncSession, *, days: float, limit: int = 5000) -> int:
    """Concurrency leases that expired more than `days` ago (their call ended or its worker
    died; an expired lease already holds no slot)."""
    return await _deleted(
        session,
        """
        DELETE FROM provider_call_lease WHERE id IN (
            SELECT id FROM provider_call_lease
            WHERE expires_at < now() - make_interval(secs => :s)
            LIMIT :lim)
        """,
        {"s": days * 86_400, "lim": limit},
    )


async def purge_parked_outbox(session: AsyncSession, *, days: float, limit: int = 5000) -> int:
    """`dead` and `failed` outbox rows parked more than `days` ago (`available_at` is when the
    last attempt parked them): an operator had that long to requeue them; a dead enqueue of a
    job that still waits is revived by the reconciler long before."""
    return await _deleted(
        session,
        """
        DELETE FROM outbox_event WHERE id IN (
            SELECT id FROM outbox_event
            WHERE status IN ('dead', 'failed')
              AND available_at < now() - make_interval(secs => :s)
            ORDER BY id LIMIT :lim)
        """,
        {"s": days * 86_400, "lim": limit},
    )


async def purge_revoked_keys(session: AsyncSession, *, days: float, limit: int = 1000) -> int:
    """Credentials revoked more than `days` ago: deleted when no job names them; a key a job
    names (the job keeps which key it was charged to) keeps its row with the ciphertext erased
    (empty; key rotation reads only keys that are not revoked). A key is looked at once: an
    erased one is no candidate any more, so the look-up of the jobs naming a key (an anti-join
    over `ai_job`) runs only while old revoked keys are left to handle. Returns both together."""
    deleted = await _deleted(
        session,
        """
        DELETE FROM user_model_credential WHERE id IN (
            SELECT c.id FROM user_model_credential c
            WHERE c.revoked_at < now() - make_interval(secs => :s)
              AND length(c.ciphertext) > 0
              AND NOT EXISTS (SELECT 1 FROM ai_job j WHERE j.credential_id = c.id)
            LIMIT :lim)
        """,
        {"s": days * 86_400, "lim": limit},
    )
    erased = await _deleted(
        session,
        """
        UPDATE user_model_credential SET ciphertext = ''::bytea
        WHERE id IN (
            SELECT id FROM user_model_credential
            WHERE revoked_at < now() - make_interval(secs => :s) AND length(ciphertext) > 0
            LIMIT :lim)
        """,
        {"s": days * 86_400, "lim": limit},
    )
    return deleted + erased
