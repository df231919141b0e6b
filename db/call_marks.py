"""`ai_call_mark`: the provider calls EXECUTE sent and has not settled yet.

A mark is written in a transaction the call already has (its attempt's first transaction, or a
fallback move's), before the call goes out, and carries what the call is charged if nothing of
its answer is ever known: its worst case (jobs/call_marks.py). Whatever writes the call's usage
row deletes its mark in the same statement (db/usage.py INSERT): an answer, a failure, a cancel,
a drain. A mark that outlives its call is a call whose worker died during it (SIGKILL, a lost
host, an OOM kill): `CHARGE_DEAD` turns it into the call's `estimated` usage row, with its
daily bucket and the job's spend, in one statement, and deletes it. Two places run it:

- the next attempt's take, pipelined in its round trip before the job is read (db/attempts.py
  `take`), so the admission's cost cover sees the dead call's charge: a killed worker never
  lets the job spend past its reservation, its cap or its user's budget;
- the job's `failed` or `cancelled` ending (jobs/lifecycle.py), so a job whose last attempt
  died ends with every call it sent charged.

A late write of the dead call's own usage row (its worker was only frozen) finds the row the
mark became under the same identity (job, attempt, chunk, call) and writes nothing: a call is
charged once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db import pipeline

# The code a dead call's usage row carries: its worker was lost (as a heartbeat timeout says).
WORKER_LOST = "INTERNAL_WORKER_LOST"


@dataclass(frozen=True)
class CallMark:
    """One call about to be sent, with its worst-case charge."""

    job_id: uuid.UUID
    call_no: int
    attempt_no: int
    chunk_no: int | None
    user_id: str
    job_type: str
    credential_mode: str
    provider: str
    model: str
    priced_as: str | None
    tokens_in: int
    tokens_out: int
    cost_usd: Decimal
    service_tier: str = "standard"


_MARK = text(
    """
    INSERT INTO ai_call_mark (job_id, call_no, attempt_no, chunk_no, user_id, job_type,
        credential_mode, provider, model, priced_as, tokens_in, tokens_out, cost_usd,
        service_tier)
    VALUES (:job_id, :call_no, :attempt_no, :chunk_no, :user_id, :job_type, :credential_mode,
        :provider, :model, :priced_as, :tokens_in, :tokens_out, :cost_usd, :service_tier)
    ON CONFLICT (job_id, call_no) DO NOTHING
    """
)


async def mark_sent(s: AsyncSession, mark: CallMark) -> None:
    """The call is about to be sent: its mark, in the caller's transaction (which commits
    before the call goes out). Sent by the driver itself (one statement, no result to build):
    it is on every call's path."""
    await pipeline.in_session(s, [(_MARK, mark.__dict__)])


# The dead marks of `:job_id` (every chunk's when `:every_chunk`, else `:chunk_no`'s: NULL for
# a one-call job; with `:token`, only while that attempt holds the job's lock) become their
# calls' usage rows, estimated at their worst case, with their
# daily buckets (the scopes' too, for a job with an organisation, teams or tags) and the job's
# spend, like db/usage.py INSERT does for one call; the marks are
# deleted. A mark whose usage row exists already (written late) charges nothing again.
CHARGE_DEAD = text(
    """
    WITH dead AS (
        DELETE FROM ai_call_mark m
        WHERE m.job_id = :job_id
          AND (CAST(:every_chunk AS boolean)
               OR m.chunk_no IS NOT DISTINCT FROM CAST(:chunk_no AS integer))
          AND (CAST(:token AS text) IS NULL
               OR EXISTS (SELECT 1 FROM ai_job j WHERE j.id = :job_id AND j.locked_by = :token))
        RETURNING m.*
    ), logged AS (
        INSERT INTO ai_usage_log (job_id, user_id, attempt_no, credential_mode, provider,
            model, tokens_in, tokens_out, cost_usd, latency_ms, error_code, chunk_no, call_no,
            created_at, cost_basis, priced_as, cached_input_tokens, reasoning_tokens,
            service_tier)
        SELECT job_id, user_id, attempt_no, credential_mode, provider, model, tokens_in,
               tokens_out, cost_usd, 0, CAST(:code AS text), chunk_no, call_no, now(),
               'estimated', priced_as, 0, 0, service_tier
        FROM dead
        ON CONFLICT DO NOTHING
        RETURNING call_no, created_at, tokens_in, tokens_out, cost_usd, model,
                  credential_mode, user_id
    ), rolled AS (
        INSERT INTO ai_usage_daily AS d (day, user_id, job_type, model, credential_mode,
            calls, tokens_in, tokens_out, cost_usd, estimated_cost_usd)
        SELECT (l.created_at AT TIME ZONE 'UTC')::date, l.user_id, dead.job_type, l.model,
               l.credential_mode, count(*), sum(l.tokens_in), sum(l.tokens_out),
               sum(l.cost_usd), sum(l.cost_usd)
        FROM logged l JOIN dead ON dead.call_no = l.call_no
        GROUP BY 1, 2, 3, 4, 5
        ON CONFLICT (day, user_id, job_type, model, credential_mode) DO UPDATE
        SET calls = d.calls + EXCLUDED.calls,
            tokens_in = d.tokens_in + EXCLUDED.tokens_in,
            tokens_out = d.tokens_out + EXCLUDED.tokens_out,
            cost_usd = d.cost_usd + EXCLUDED.cost_usd,
            estimated_cost_usd = d.estimated_cost_usd + EXCLUDED.estimated_cost_usd
    ), scoped AS (
        SELECT (l.created_at AT TIME ZONE 'UTC')::date AS day, l.user_id, dead.job_type,
               l.model, l.credential_mode, l.tokens_in, l.tokens_out, l.cost_usd,
               j.org_id, j.team_ids, j.tags
        FROM logged l JOIN dead ON dead.call_no = l.call_no JOIN ai_job j ON j.id = :job_id
        WHERE j.org_id IS NOT NULL OR j.team_ids <> '{}' OR j.tags <> '{}'
    ), scope_rolled AS (
        INSERT INTO ai_usage_scoped_daily AS d (day, user_id, job_type, model, credential_mode,
            scope_key, org_id, team_ids, tags, calls, tokens_in, tokens_out, cost_usd,
            estimated_cost_usd)
        SELECT day, user_id, job_type, model, credential_mode,
               md5(coalesce(org_id, '') || '|' || array_to_string(team_ids, ',') || '|'
                   || array_to_string(tags, ',')),
               org_id, team_ids, tags, count(*), sum(tokens_in), sum(tokens_out),
               sum(cost_usd), sum(cost_usd)
        FROM scoped
        GROUP BY day, user_id, job_type, model, credential_mode, org_id, team_ids, tags
        ON CONFLICT (day, user_id, job_type, model, credential_mode, scope_key) DO UPDATE
        SET calls = d.calls + EXCLUDED.calls,
            tokens_in = d.tokens_in + EXCLUDED.tokens_in,
            tokens_out = d.tokens_out + EXCLUDED.tokens_out,
            cost_usd = d.cost_usd + EXCLUDED.cost_usd,
            estimated_cost_usd = d.estimated_cost_usd + EXCLUDED.estimated_cost_usd
    ), per_scope AS (
        INSERT INTO ai_scope_usage_daily AS d (scope, scope_id, day, calls, cost_usd)
        SELECT x.scope, x.scope_id, scoped.day, count(*), sum(scoped.cost_usd)
        FROM scoped CROSS JOIN LATERAL (
            SELECT 'org', scoped.org_id WHERE scoped.org_id IS NOT NULL
            UNION SELECT 'team', t FROM unnest(scoped.team_ids) t
            UNION SELECT 'tag', g FROM unnest(scoped.tags) g) AS x(scope, scope_id)
        GROUP BY x.scope, x.scope_id, scoped.day
        ON CONFLICT (scope, scope_id, day) DO UPDATE
        SET calls = d.calls + EXCLUDED.calls, cost_usd = d.cost_usd + EXCLUDED.cost_usd
    ), spent AS (
        UPDATE ai_job SET spent_cost_usd = spent_cost_usd
            + (SELECT coalesce(sum(cost_usd), 0) FROM logged)
        WHERE id = :job_id AND EXISTS (SELECT 1 FROM logged)
        RETURNING id
    )
    SELECT (SELECT count(*) FROM logged) AS charged,
           (SELECT coalesce(sum(cost_usd), 0) FROM logged) AS cost
    """
)


def charge_dead_params(
    job_id: uuid.UUID,
    *,
    chunk_no: int | None = None,
    every_chunk: bool = False,
    token: str | None = None,
    code: str = WORKER_LOST,
) -> dict[str, object]:
    return {
        "job_id": job_id,
        "chunk_no": chunk_no,
        "every_chunk": every_chunk,
        "token": token,
        "code": code,
    }


async def charge_dead(
    s: AsyncSession, job_id: uuid.UUID, *, code: str = WORKER_LOST
) -> tuple[int, Decimal]:
    """Every mark the job still has (any chunk's) charged as its call's estimated usage row, in
    the caller's transaction: the calls it sent whose workers died. (calls charged, cost)."""
    row = (
        await s.execute(CHARGE_DEAD, charge_dead_params(job_id, every_chunk=True, code=code))
    ).one()
    return int(row.charged), Decimal(row.cost)
