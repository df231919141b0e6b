"""The usage figure's log (`bench/usage.py` times the reads on it): `ai_job` and `ai_usage_log`
rows loaded in SQL with `INSERT ... SELECT generate_series`, in batches with progress between
them, then the `ai_usage_daily` rollup the migration's backfill builds, checked against the log.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.procs import progress
from db.session import SessionMaker

JOB_TYPES = (
    "synthetic",
    "quiz_generation",
    "flashcard_generation",
    "weak_point_analysis",
    "learning_analysis",
)
MODELS = ("deepseek-chat", "deepseek-reasoner", "gpt-4o-mini")
CALLS_PER_JOB = 20
DAYS = 90
BATCH = 1_000_000  # usage rows per INSERT ... SELECT (progress between them)

# Jobs are numbered 0..jobs-1; job n belongs to user n % users, has type n // users % 5, and
# was created at a pseudo-random second of the last DAYS days (7919 is prime, so the seconds
# spread); 1 job in 10 ran on the user's own key. Its calls follow it by a second each.
_JOB_CREATED = "(CAST(:t0 AS timestamptz) - (((n * 7919) % (:days * 86400)) * interval '1 second'))"
_SEED_JOBS = f"""
    INSERT INTO ai_job (id, user_id, job_type, target_type, target_id, request_fingerprint,
                        lifecycle_status, status, queue_name, priority, progress, input,
                        credential_mode, prompt_version, input_schema_version,
                        output_schema_version, attempt_count, max_retry_count, workflow_id,
                        created_at, updated_at, estimated_input_tokens, max_output_tokens)
    SELECT md5('job' || n)::uuid, 'user-' || (n % :users),
           (CAST(:types AS text[]))[1 + (n / :users) % 5], 'bench', 'b-' || n, md5('f' || n),
           'queued', 'pending', 'ai-background', 50, 0, '{{}}'::jsonb,
           CASE WHEN n % 10 = 0 THEN 'user_deepseek_key' ELSE 'platform_key' END,
           'v1', 'v1', 'v1', 0, 3, 'bench:' || n, {_JOB_CREATED}, {_JOB_CREATED}, 1000, 2048
    FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint) - 1) AS n
"""
_SEED_USAGE = f"""
    INSERT INTO ai_usage_log (job_id, user_id, attempt_no, credential_mode, provider, model,
                              tokens_in, tokens_out, cost_usd, latency_ms, error_code,
                              created_at)
    SELECT md5('job' || n)::uuid, 'user-' || (n % :users), 1 + (i % {CALLS_PER_JOB}) / 10,
           CASE WHEN n % 10 = 0 THEN 'user_deepseek_key' ELSE 'platform_key' END, 'deepseek',
           (CAST(:models AS text[]))[1 + i % 3], 500 + i % 1000,
           CASE WHEN i % 50 = 0 THEN 0 ELSE 200 + i % 500 END,
           CASE WHEN i % 50 = 0 THEN 0 ELSE round((500 + i % 1000) * 0.00000027
                + (200 + i % 500) * 0.0000011, 8) END,
           100 + i % 900, CASE WHEN i % 50 = 0 THEN 'PROVIDER_TIMEOUT' END,
           {_JOB_CREATED} + (i % {CALLS_PER_JOB}) * interval '1 second'
    FROM (SELECT i, i / {CALLS_PER_JOB} AS n
          FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint) - 1) AS i) g
"""
# The migration's backfill (0013_tokens_and_money.py): the rollup of the whole log.
_ROLLUP = """
    INSERT INTO ai_usage_daily (day, user_id, job_type, model, credential_mode, calls,
        tokens_in, tokens_out, cost_usd)
    SELECT (u.created_at AT TIME ZONE 'UTC')::date, u.user_id, j.job_type, u.model,
           u.credential_mode, count(*), sum(u.tokens_in), sum(u.tokens_out), sum(u.cost_usd)
    FROM ai_usage_log u JOIN ai_job j ON j.id = u.job_id
    GROUP BY 1, 2, 3, 4, 5
"""


async def load(
    engine: AsyncEngine, sm: SessionMaker, rows: int, users: int
) -> tuple[int, float, float, int]:
    """Seed jobs, usage rows and the rollup; (jobs, load s, rollup s, rollup rows)."""
    jobs = max(1, -(-rows // CALLS_PER_JOB))
    t0 = datetime.now(UTC).replace(microsecond=0)
    common = {"users": users, "t0": t0, "days": DAYS}
    start = time.perf_counter()
    for lo in range(0, jobs, BATCH):
        hi = min(jobs, lo + BATCH)
        async with sm.begin() as s:
            await s.execute(
                text(_SEED_JOBS), {**common, "lo": lo, "hi": hi, "types": list(JOB_TYPES)}
            )
        progress(f"usage: {hi} jobs")
    for lo in range(0, rows, BATCH):
        hi = min(rows, lo + BATCH)
        async with sm.begin() as s:
            await s.execute(
                text(_SEED_USAGE), {**common, "lo": lo, "hi": hi, "models": list(MODELS)}
            )
        progress(f"usage: {hi} usage rows")
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    async with sm.begin() as s:
        await s.execute(text(_ROLLUP))
    rollup_s = time.perf_counter() - start
    # VACUUM: the visibility map lets the rollup's reads be index-only scans, as they are on a
    # long-running server; ANALYZE: plans from real statistics.
    async with engine.connect() as c:
        c = await c.execution_options(isolation_level="AUTOCOMMIT")
        for table in ("ai_job", "ai_usage_log", "ai_usage_daily"):
            await c.execute(text(f"VACUUM ANALYZE {table}"))
        n = (await c.execute(text("SELECT count(*) FROM ai_usage_daily"))).scalar_one()
    return jobs, load_s, rollup_s, int(n)


async def check_rollup(sm: SessionMaker) -> None:
    """The rollup holds exactly the log's sums (a quick check of the load, not of the API)."""
    async with sm() as s:
        a = (
            await s.execute(
                text(
                    "SELECT sum(calls), sum(tokens_in), sum(tokens_out), sum(cost_usd) "
                    "FROM ai_usage_daily"
                )
            )
        ).one()
        b = (
            await s.execute(
                text(
                    "SELECT count(*), sum(tokens_in), sum(tokens_out), sum(cost_usd) "
                    "FROM ai_usage_log"
                )
            )
        ).one()
    if tuple(a) != tuple(b):
        raise SystemExit(f"rollup {tuple(a)} != log {tuple(b)}")
