"""`ai_usage_log`: one row per provider call, written in EXECUTE's transaction, and what reads it.

Writing a usage row keeps two running sums in the same statement (so in the same transaction,
and never one without the other): the row's `ai_usage_daily` bucket (UTC day, user, job type,
model, credential mode) and the job's `ai_job.spent_cost_usd`. Budgets and the usage API read the
rollup, so their cost follows the number of (day, user, job type, model, mode) buckets, not the
number of calls; a job's own usage is read from the log by its `job_id` index.

Every read takes bound parameters; a grouping is chosen from a fixed mapping (`GROUPINGS`),
never spliced from the request."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Any, Literal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession


@dataclass(frozen=True)
class UsageRow:
    job_id: uuid.UUID
    user_id: str
    job_type: str
    attempt_no: int
    credential_mode: str
    provider: str
    model: str
    tokens_in: int
    tokens_out: int
    cost_usd: Decimal
    latency_ms: int
    error_code: str | None
    chunk_no: int | None = None  # a long source's chunk the call was for (None: one call)
    # Which call of the job (`ai_job.call_seq` at its attempt's take): with the job, attempt
    # and chunk, the row's one identity. None: unnumbered (never deduplicated).
    call_no: int | None = None
    # "reported": the provider's usage; "estimated": the engine's bound (jobs/charging.py).
    cost_basis: str = "reported"
    priced_as: str | None = None  # the model whose price the call was charged at
    cached_input_tokens: int = 0  # of tokens_in, served from the provider's cache
    reasoning_tokens: int = 0  # of tokens_out, spent reasoning
    # The tier the call was priced at: "standard", "batch" (the provider's Batch API) or
    # "offpeak" (inside the provider's discount window).
    service_tier: str = "standard"
    # The structured-output form the call asked for (None: no call of a chat model).
    structured_output: str | None = None


@dataclass(frozen=True)
class UsageSummary:
    calls: int
    tokens_in: int
    tokens_out: int
    cost_usd: Decimal


# One statement on EXECUTE's hot path instead of three round trips: the log row, its daily
# bucket and the job's spend; for a job with an organisation, teams or tags also its buckets
# of the usage rollup by scope and each scope's day (whose trigger sends a budget's alerts,
# db/scope_budgets.py), none of which a job without scopes writes. The bucket's day is the
# row's own `created_at` in UTC, so the rollup and a GROUP BY over the log agree on every row's
# day whatever the server's time zone. ON CONFLICT ... DO UPDATE locks the bucket row until
# commit: concurrent calls of one user, job type and model on one day queue there briefly
# instead of losing an update. A call that cost
# nothing (a failed attempt, the synthetic provider) leaves the job row alone.
# Idempotent: a row whose (job, attempt, chunk, call) is already logged (the same write retried
# after a commit whose answer was lost) inserts nothing, and then neither the bucket nor the
# job's spend moves: a call is charged once. The call's mark (db/call_marks.py), written before
# it was sent, goes in the same statement: the call is settled.
_INSERT = text(
    """
    WITH settled AS (
        DELETE FROM ai_call_mark WHERE job_id = :job_id AND call_no = :call_no
    ), logged AS (
        INSERT INTO ai_usage_log (job_id, user_id, attempt_no, credential_mode, provider,
            model, tokens_in, tokens_out, cost_usd, latency_ms, error_code, chunk_no, call_no,
            created_at, cost_basis, priced_as, cached_input_tokens, reasoning_tokens,
            service_tier, structured_output)
        VALUES (:job_id, :user_id, :attempt_no, :credential_mode, :provider, :model,
            :tokens_in, :tokens_out, :cost_usd, :latency_ms, :error_code, :chunk_no, :call_no,
            now(), :cost_basis, :priced_as, :cached_input_tokens, :reasoning_tokens,
            :service_tier, :structured_output)
        ON CONFLICT DO NOTHING
        RETURNING created_at
    ), rolled AS (
        INSERT INTO ai_usage_daily AS d (day, user_id, job_type, model, credential_mode, calls,
            tokens_in, tokens_out, cost_usd, estimated_cost_usd)
        SELECT (logged.created_at AT TIME ZONE 'UTC')::date, :user_id, :job_type, :model,
               :credential_mode, 1, :tokens_in, :tokens_out, :cost_usd,
               CASE WHEN :cost_basis = 'estimated' THEN CAST(:cost_usd AS numeric) ELSE 0 END
        FROM logged
        ON CONFLICT (day, user_id, job_type, model, credential_mode) DO UPDATE
        SET calls = d.calls + 1,
            tokens_in = d.tokens_in + EXCLUDED.tokens_in,
            tokens_out = d.tokens_out + EXCLUDED.tokens_out,
            cost_usd = d.cost_usd + EXCLUDED.cost_usd,
            estimated_cost_usd = d.estimated_cost_usd + EXCLUDED.estimated_cost_usd
    ), scoped AS (
        SELECT (logged.created_at AT TIME ZONE 'UTC')::date AS day, j.org_id, j.team_ids, j.tags
        FROM logged JOIN ai_job j ON j.id = :job_id
        WHERE j.org_id IS NOT NULL OR j.team_ids <> '{}' OR j.tags <> '{}'
    ), scope_rolled AS (
        INSERT INTO ai_usage_scoped_daily AS d (day, user_id, job_type, model, credential_mode,
            scope_key, org_id, team_ids, tags, calls, tokens_in, tokens_out, cost_usd,
            estimated_cost_usd)
        SELECT day, :user_id, :job_type, :model, :credential_mode,
               md5(coalesce(org_id, '') || '|' || array_to_string(team_ids, ',') || '|'
                   || array_to_string(tags, ',')),
               org_id, team_ids, tags, 1, :tokens_in, :tokens_out, :cost_usd,
               CASE WHEN :cost_basis = 'estimated' THEN CAST(:cost_usd AS numeric) ELSE 0 END
        FROM scoped
        ON CONFLICT (day, user_id, job_type, model, credential_mode, scope_key) DO UPDATE
        SET calls = d.calls + 1,
            tokens_in = d.tokens_in + EXCLUDED.tokens_in,
            tokens_out = d.tokens_out + EXCLUDED.tokens_out,
            cost_usd = d.cost_usd + EXCLUDED.cost_usd,
            estimated_cost_usd = d.estimated_cost_usd + EXCLUDED.estimated_cost_usd
    ), per_scope AS (
        INSERT INTO ai_scope_usage_daily AS d (scope, scope_id, day, calls, cost_usd)
        SELECT x.scope, x.scope_id, scoped.day, 1, :cost_usd
        FROM scoped CROSS JOIN LATERAL (
            SELECT 'org', scoped.org_id WHERE scoped.org_id IS NOT NULL
            UNION SELECT 'team', t FROM unnest(scoped.team_ids) t
            UNION SELECT 'tag', g FROM unnest(scoped.tags) g) AS x(scope, scope_id)
        ON CONFLICT (scope, scope_id, day) DO UPDATE
        SET calls = d.calls + 1, cost_usd = d.cost_usd + EXCLUDED.cost_usd
    )
    UPDATE ai_job SET spent_cost_usd = spent_cost_usd + :cost_usd
    WHERE id = :job_id AND CAST(:cost_usd AS numeric) <> 0 AND EXISTS (SELECT 1 FROM logged)
    """
)


# A job's usage summary; also run pipelined by PROJECT's ending (db/endings.py) and COMPLETE
# (db/stage_reads.py).
SUMMARY = text(
    """
    SELECT count(*) AS calls, coalesce(sum(tokens_in), 0) AS tin,
           coalesce(sum(tokens_out), 0) AS tout,
           coalesce(sum(cost_usd), 0) AS cost
    FROM ai_usage_log WHERE job_id = :id
    """
)
# The name EXECUTE's pipelined last transaction runs the call's row under (db/pipeline.py).
INSERT = _INSERT


def summary_of(r: dict[str, Any]) -> UsageSummary:
    return UsageSummary(int(r["calls"]), int(r["tin"]), int(r["tout"]), Decimal(r["cost"]))


async def insert(session: AsyncSession, row: UsageRow) -> None:
    """The call's log row, its daily bucket and the job's spend, in the caller's
    transaction (never committed here): all three or none."""
    await session.execute(_INSERT, row.__dict__)


async def calls_with(
    session: AsyncSession,
    job_id: uuid.UUID,
    attempt_no: int,
    error_code: str,
    *,
    chunk_no: int | None = None,
) -> int:
    """How many calls of one attempt of a job (of one chunk's, for a chunked job) ended
    with `error_code`."""
    n = (
        await session.execute(
            text(
                "SELECT count(*) FROM ai_usage_log "
                "WHERE job_id = :j AND attempt_no = :a AND error_code = :c "
                "AND chunk_no IS NOT DISTINCT FROM CAST(:k AS integer)"
            ),
            {"j": job_id, "a": attempt_no, "c": error_code, "k": chunk_no},
        )
    ).scalar_one()
    return int(n)


async def summary(session: AsyncSession, job_id: uuid.UUID) -> UsageSummary:
    r = (await session.execute(SUMMARY, {"id": job_id})).one()
    return summary_of(dict(r._mapping))


# ---- the usage API's reads -------------------------------------------------------------------

Grouping = Literal["day", "jobType", "model", "user", "credentialMode"]
# The only columns a usage read may group by: the request names a key of this mapping, and the
# column spliced into the SQL is one of these constants, never the request's text.
GROUPINGS: dict[str, str] = {
    "day": "day",
    "jobType": "job_type",
    "model": "model",
    "user": "user_id",
    "credentialMode": "credential_mode",
}


@dataclass(frozen=True)
class UsageFilter:
    """Which buckets a usage read sums: UTC days `start`..`end` inclusive, and optionally one
    user, job type, model or credential mode."""

    start: date
    end: date
    user_id: str | None = None
    job_type: str | None = None
    model: str | None = None
    credential_mode: str | None = None


@dataclass(frozen=True)
class UsageBucket:
    key: str
    calls: int
    tokens_in: int
    tokens_out: int
    cost_usd: Decimal
    estimated_cost_usd: Decimal = Decimal(0)  # the share charged on the engine's estimate


@dataclass(frozen=True)
class CallUsage:
    """One provider call as its usage row says: the model as echoed, the model it was priced
    as, its tokens (with their cached and reasoning parts), its cost, how it was found and the
    service tier it was priced at."""

    attempt: int
    model: str
    priced_as: str | None
    tokens_in: int
    tokens_out: int
    cached_input_tokens: int
    reasoning_tokens: int
    cost_usd: Decimal
    cost_basis: str
    service_tier: str = "standard"

    @property
    def estimated(self) -> bool:
        return self.cost_basis == "estimated"


@dataclass(frozen=True)
class AttemptUsage:
    attempt: int
    calls: int
    tokens_in: int
    tokens_out: int
    cost_usd: Decimal
    error_codes: list[str]
    estimated_cost_usd: Decimal = Decimal(0)
    provider_calls: list[CallUsage] = field(default_factory=list)  # in call order


# The optional filters of a usage read: (UsageFilter field, rollup column, log column).
_FILTERS = (
    ("user_id", "user_id", "u.user_id"),
    ("job_type", "job_type", "j.job_type"),
    ("model", "model", "u.model"),
    ("credential_mode", "credential_mode", "u.credential_mode"),
)


def grouped_usage_sql(group_by: str, f: UsageFilter, *, from_log: bool = False) -> str:
    """The SQL of `grouped_usage` (and of the benchmark's baseline straight from the log,
    `from_log`). Only column names from the fixed tables above are spliced in, one condition per
    filter that is set (so each shape gets its own plan, and `user_id` reaches its index);
    every value is a bound parameter. Raises KeyError for a grouping outside `GROUPINGS`."""
    col = GROUPINGS[group_by]
    given = [(name, rolled, logged) for name, rolled, logged in _FILTERS if getattr(f, name)]
    if from_log:
        # The same sums computed from every call instead of the rollup (the bench's baseline).
        day = "(u.created_at AT TIME ZONE 'UTC')::date"
        key = {"day": day, "job_type": "j.job_type"}.get(col, f"u.{col}")
        where = "".join(f" AND {logged} = :{name}" for name, _, logged in given)
        # The log has no job type: only a read by job type joins the job.
        join = " JOIN ai_job j ON j.id = u.job_id" if "j.job_type" in key + where else ""
        return f"""
            SELECT {key} AS key, count(*) AS calls, sum(u.tokens_in) AS tin,
                   sum(u.tokens_out) AS tout, sum(u.cost_usd) AS cost,
                   coalesce(sum(u.cost_usd) FILTER (WHERE u.cost_basis = 'estimated'), 0) AS est
            FROM ai_usage_log u{join}
            WHERE u.created_at >= CAST(:start AS date) AT TIME ZONE 'UTC'
              AND u.created_at < (CAST(:end AS date) + 1) AT TIME ZONE 'UTC'{where}
            GROUP BY 1 ORDER BY 1
        """
    where = "".join(f" AND {rolled} = :{name}" for name, rolled, _ in given)
    return f"""
        SELECT {col} AS key, sum(calls) AS calls, sum(tokens_in) AS tin,
               sum(tokens_out) AS tout, sum(cost_usd) AS cost,
               sum(estimated_cost_usd) AS est
        FROM ai_usage_daily
        WHERE day BETWEEN :start AND :end{where}
        GROUP BY 1 ORDER BY 1
    """


def usage_params(f: UsageFilter) -> dict[str, object]:
    params: dict[str, object] = {"start": f.start, "end": f.end}
    params.update({name: getattr(f, name) for name, _, _ in _FILTERS if getattr(f, name)})
    return params


async def grouped_usage(
    session: AsyncSession, f: UsageFilter, group_by: Grouping
) -> list[UsageBucket]:
    """The rollup's sums over `f`, one bucket per value of `group_by`, in key order (days as
    `YYYY-MM-DD`)."""
    rows = await session.execute(text(grouped_usage_sql(group_by, f)), usage_params(f))
    return [
        UsageBucket(
            key=r.key.isoformat() if isinstance(r.key, date) else str(r.key),
            calls=int(r.calls),
            tokens_in=int(r.tin),
            tokens_out=int(r.tout),
            cost_usd=Decimal(r.cost),
            estimated_cost_usd=Decimal(r.est),
        )
        for r in rows
    ]


JOB_ATTEMPTS_SQL = """
    SELECT attempt_no, count(*) AS calls, sum(tokens_in) AS tin,
           sum(tokens_out) AS tout, sum(cost_usd) AS cost,
           coalesce(array_agg(error_code ORDER BY id)
                    FILTER (WHERE error_code IS NOT NULL), '{}') AS codes
    FROM ai_usage_log WHERE job_id = :j
    GROUP BY attempt_no ORDER BY attempt_no
"""


async def job_attempts(session: AsyncSession, job_id: uuid.UUID) -> list[AttemptUsage]:
    """A job's calls summed per attempt, in attempt order, with the error code of every failed
    call in the order the calls were made (read by the log's `job_id` index)."""
    rows = await session.execute(text(JOB_ATTEMPTS_SQL), {"j": job_id})
    calls = await job_calls(session, job_id)
    return [
        AttemptUsage(
            attempt=int(r.attempt_no),
            calls=int(r.calls),
            tokens_in=int(r.tin),
            tokens_out=int(r.tout),
            cost_usd=Decimal(r.cost),
            error_codes=list(r.codes),
            estimated_cost_usd=sum(
                (c.cost_usd for c in calls if c.attempt == r.attempt_no and c.estimated),
                Decimal(0),
            ),
            provider_calls=[c for c in calls if c.attempt == r.attempt_no],
        )
        for r in rows
    ]


JOB_CALLS_SQL = """
    SELECT attempt_no, model, priced_as, tokens_in, tokens_out, cached_input_tokens,
           reasoning_tokens, cost_usd, cost_basis, service_tier
    FROM ai_usage_log WHERE job_id = :j
    ORDER BY attempt_no, id
"""


async def job_calls(session: AsyncSession, job_id: uuid.UUID) -> list[CallUsage]:
    """A job's calls one by one, in attempt and call order (read by the log's `job_id`
    index)."""
    rows = await session.execute(text(JOB_CALLS_SQL), {"j": job_id})
    return [
        CallUsage(
            attempt=int(r.attempt_no),
            model=r.model,
            priced_as=r.priced_as,
            tokens_in=int(r.tokens_in),
            tokens_out=int(r.tokens_out),
            cached_input_tokens=int(r.cached_input_tokens),
            reasoning_tokens=int(r.reasoning_tokens),
            cost_usd=Decimal(r.cost_usd),
            cost_basis=r.cost_basis,
            service_tier=r.service_tier,
        )
        for r in rows
    ]


@dataclass(frozen=True)
class JobMoney:
    """What create fixed about a job's tokens and money, and whose job it is (the owner rule
    runs on `user_id` before anything else of it is shown)."""

    user_id: str
    estimated_input_tokens: int | None
    max_output_tokens: int | None
    max_cost_usd: Decimal | None
    reserved_cost_usd: Decimal


async def job_money(session: AsyncSession, job_id: uuid.UUID) -> JobMoney | None:
    """The job's owner and money columns (not its input or output); None when it is missing."""
    r = (
        await session.execute(
            text(
                "SELECT user_id, estimated_input_tokens, max_output_tokens, max_cost_usd, "
                "reserved_cost_usd FROM ai_job WHERE id = :j"
            ),
            {"j": job_id},
        )
    ).first()
    if r is None:
        return None
    return JobMoney(
        user_id=r.user_id,
        estimated_input_tokens=r.estimated_input_tokens,
        max_output_tokens=r.max_output_tokens,
        max_cost_usd=r.max_cost_usd,
        reserved_cost_usd=Decimal(r.reserved_cost_usd),
    )
