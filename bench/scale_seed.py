"""The scale figure's history (`bench/scale.py` measures on it).

Seeding is set-based SQL (one INSERT ... SELECT FROM generate_series per table) into the schema
the migrations built, in created_at order as a live table grows. The history is shaped like one
a busy deployment keeps:
- `jobs` ai_job rows (1,000,000 by default) over `users` users (5,000), of which ONE user owns a
  fifth (200,000 of 1M); the rest spread evenly;
- lifecycle mix: ~2 % failed, ~3 % cancelled (half of them before starting), the rest succeeded,
  except the newest 0.02 % which are still queued or running (their owners' active jobs);
- every job type of `jobs.types.default_catalog()` (so both queues), weighted like real use;
- created_at evenly spread over 90 days; `input` a ~300-byte jsonb, a small `output` on
  succeeded jobs;
- 2 x `jobs` outbox_event rows, all `published`, published_at spread over the same 90 days.
The lifecycle trigger only admits inserts at `queued`; the seeding session sets
`session_replication_role = replica` (superuser) so history can be inserted in its final state.
Plain column indexes that back no constraint are dropped for the insert and built again from
their own definitions afterwards (checked to be identical), which makes seeding several times
faster; freshly built indexes are more compact than ones grown by inserts. After seeding: VACUUM
(ANALYZE) as autovacuum would have done on a table this old, then a CHECKPOINT so the seed's WAL
is not flushed during the measurements.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from bench.infra import TABLES
from bench.procs import progress

HOT_USER = "bench-scale-hot"
USER_PREFIX = "bench-scale-u"
HISTORY_DAYS = 90
OUTBOX_PER_JOB = 2
LIST_LIMIT = 21
# Share of jobs per type (out of 10,000); a type added to the catalog later gets the remainder.
TYPE_WEIGHTS = {
    "quiz_generation": 4000,
    "flashcard_generation": 3500,
    "weak_point_analysis": 2000,
    "synthetic": 500,
}
FAILED_PER_10K = 200
CANCELLED_PER_10K = 300


def _type_columns() -> dict[str, list[Any]]:
    from engine.queues import resolve_execution
    from jobs.types import default_catalog

    defs = [jt.definition for jt in default_catalog()]
    known = [d for d in defs if d.job_type in TYPE_WEIGHTS]
    extra = [d for d in defs if d.job_type not in TYPE_WEIGHTS]
    weights = [TYPE_WEIGHTS[d.job_type] for d in known]
    if extra:
        # Unknown types share an equal slice carved out of the known ones' total.
        share = max(1, 10_000 // (len(defs) * 4))
        weights = [w * (10_000 - share * len(extra)) // 10_000 for w in weights]
        weights += [share] * len(extra)
    ordered = known + extra
    bounds, acc = [], 0
    for w in weights:
        acc += w
        bounds.append(acc)
    bounds[-1] = 10_000
    return {
        "bounds": bounds,
        "job_type": [d.job_type for d in ordered],
        "queue": [d.queue.queue_name for d in ordered],
        "priority": [d.queue.default_priority for d in ordered],
        "prompt": [d.prompt_version for d in ordered],
        "in_schema": [d.input.schema_version for d in ordered],
        "out_schema": [d.output.schema_version for d in ordered],
        # The effective count a create stores (the queue's when the definition sets none).
        "retries": [resolve_execution(d).max_retries for d in ordered],
    }


def _legacy_case() -> str:
    from engine.lifecycle import LEGACY_STATUS

    whens = " ".join(f"WHEN '{k.value}' THEN '{v}'" for k, v in LEGACY_STATUS.items())
    return f"CASE s.st {whens} END"


def _jobs_sql(n_types: int) -> str:
    # h1 picks the status, h2 the job type, h3 durations and variants: hashes of the row number,
    # so a seed is the same on every run.
    ti = " ".join(f"WHEN s_h2 < (%(bounds)s::int[])[{k}] THEN {k}" for k in range(1, n_types + 1))
    return f"""
INSERT INTO ai_job (id, user_id, job_type, target_type, target_id, idempotency_key,
  request_fingerprint, lifecycle_status, status, queue_name, priority, progress, input,
  credential_mode, credential_id, prompt_version, input_schema_version, output_schema_version,
  attempt_count, max_retry_count, locked_by, locked_at, lock_until, started_at, finished_at,
  error_code, public_error_message, output, output_hash, workflow_id, created_at, updated_at)
SELECT s.id, s.user_id, s.job_type, 'document', 'doc-' || (s.g %% 50000),
  CASE WHEN s.g %% 2 = 0 THEN 'key-' || s.g END,
  md5(s.g::text) || md5(s.id::text),
  s.st, {_legacy_case()}, s.queue, s.priority,
  CASE s.st WHEN 'succeeded' THEN 100 WHEN 'running' THEN 40 ELSE 0 END,
  jsonb_build_object('sourceText', repeat(md5(s.g::text), 7), 'language', 'en',
                     'count', 10, 'difficulty', 'medium', 'title', 'Chapter ' || (s.g %% 40)),
  'platform_key', NULL, s.prompt, s.in_schema, s.out_schema,
  CASE WHEN s.st = 'queued' THEN 0 WHEN s.st = 'failed' THEN s.retries + 1 ELSE 1 END,
  s.retries,
  CASE WHEN s.st = 'running' THEN s.wf || '/bench-seed' END,
  CASE WHEN s.st = 'running' THEN s.created_at + interval '1 second' END,
  CASE WHEN s.st = 'running' THEN now() + interval '5 minutes' END,
  CASE WHEN s.st IN ('running', 'succeeded', 'failed')
         OR (s.st = 'cancelled' AND s.h3 %% 2 = 0) THEN s.created_at + interval '1 second' END,
  CASE WHEN s.st IN ('succeeded', 'failed', 'cancelled')
       THEN s.created_at + (2 + s.h3 %% 30) * interval '1 second' END,
  CASE s.st WHEN 'failed' THEN 'provider_error' WHEN 'cancelled' THEN 'cancelled' END,
  CASE s.st WHEN 'failed' THEN 'The AI provider did not answer; try again later.' END,
  CASE WHEN s.st = 'succeeded'
       THEN jsonb_build_object('items', 10, 'summary', md5(s.id::text)) END,
  CASE WHEN s.st = 'succeeded' THEN md5(s.id::text) || md5(s.g::text) END,
  s.wf, s.created_at,
  CASE WHEN s.st IN ('succeeded', 'failed', 'cancelled')
       THEN s.created_at + (2 + s.h3 %% 30) * interval '1 second' ELSE s.created_at END
FROM (
  SELECT r.*,
    (%(job_type)s::text[])[r.ti] AS job_type, (%(queue)s::text[])[r.ti] AS queue,
    (%(priority)s::int[])[r.ti] AS priority, (%(prompt)s::text[])[r.ti] AS prompt,
    (%(in_schema)s::text[])[r.ti] AS in_schema, (%(out_schema)s::text[])[r.ti] AS out_schema,
    (%(retries)s::int[])[r.ti] AS retries,
    (%(queue)s::text[])[r.ti] || ':' || (%(job_type)s::text[])[r.ti] || ':' || r.id AS wf
  FROM (
    SELECT g, gen_random_uuid() AS id,
      CASE WHEN g %% 5 = 0 THEN %(hot)s ELSE %(prefix)s || (g %% %(others)s) END AS user_id,
      CASE WHEN g > %(n)s - %(active)s THEN CASE WHEN g %% 2 = 0 THEN 'queued' ELSE 'running' END
           WHEN s_h1 < {FAILED_PER_10K} THEN 'failed'
           WHEN s_h1 < {FAILED_PER_10K + CANCELLED_PER_10K} THEN 'cancelled'
           ELSE 'succeeded' END AS st,
      CASE {ti} ELSE 1 END AS ti,
      s_h3 AS h3,
      %(t0)s::timestamptz + (g - 1) * %(step)s::interval AS created_at
    FROM (
      SELECT g, abs(hashint4extended(g, 1)) %% 10000 AS s_h1,
             abs(hashint4extended(g, 2)) %% 10000 AS s_h2,
             abs(hashint4extended(g, 3)) AS s_h3
      FROM generate_series(1, %(n)s) AS g) h) r) s
"""


_OUTBOX_SQL = """
INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload, status,
  attempt_count, available_at, published_at, created_at)
SELECT s.et, 'AiJob', s.aid, s.et || ':' || s.aid,
  jsonb_build_object('jobId', s.aid, 'jobType', 'quiz_generation', 'queueName', 'ai-interactive',
                     'priority', 40),
  'published', 1, s.ts, s.ts + interval '20 milliseconds', s.ts
FROM (
  SELECT CASE WHEN g %% 2 = 1 THEN 'ai.job.enqueue' ELSE 'ai.job.completed' END AS et,
    md5('bench-outbox-' || ((g + 1) / 2))::uuid::text AS aid,
    %(t0)s::timestamptz + (g - 1) * %(step)s::interval AS ts
  FROM generate_series(1, %(m)s) AS g) s
"""


_SECONDARY_INDEXES = """
SELECT c.relname, pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = %s::regclass
  AND i.indpred IS NULL AND i.indexprs IS NULL
  AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
ORDER BY c.relname
"""


async def _index_defs(conn: psycopg.AsyncConnection[Any], table: str) -> list[tuple[str, str]]:
    cur = await conn.execute(_SECONDARY_INDEXES, (table,))
    return [(str(r[0]), str(r[1])) for r in await cur.fetchall()]


@contextlib.asynccontextmanager
async def _indexes_built_after(
    conn: psycopg.AsyncConnection[Any], table: str, timings: dict[str, float]
) -> AsyncIterator[None]:
    """Drops the table's plain column indexes that back no constraint, and builds them again
    from their own definitions (pg_get_indexdef) once the block is done: one sorted build per
    index instead of a million random inserts. Partial indexes stay: a deparsed predicate does
    not always parse back to the same expression the migration wrote. The definitions are
    checked to be unchanged."""
    before = await _index_defs(conn, table)
    for name, _ in before:
        await conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
    try:
        yield
    finally:
        t = time.perf_counter()
        for _, ddl in before:
            await conn.execute(ddl)
        timings[f"{table}_index_build_s"] = time.perf_counter() - t
    after = await _index_defs(conn, table)
    if after != before:
        raise RuntimeError(
            f"{table}: indexes differ after the seed's rebuild: {sorted(set(before) ^ set(after))}"
        )


async def seed(uri: str, *, jobs: int, users: int) -> dict[str, Any]:
    """Insert the history (see the module docstring); returns what was inserted and timings."""
    cols = _type_columns()
    others = max(1, users - 1)
    active = max(10, jobs // 5000)
    now = datetime.now(UTC)
    t0 = now - timedelta(days=HISTORY_DAYS)
    span = timedelta(days=HISTORY_DAYS) - timedelta(seconds=1)
    params: dict[str, Any] = {
        **cols,
        "n": jobs,
        "hot": HOT_USER,
        "prefix": USER_PREFIX,
        "others": others,
        "active": active,
        "t0": t0,
        "step": span / max(1, jobs),
    }
    out: dict[str, Any] = {"jobs": jobs, "users": others + 1, "hot_user_jobs": jobs // 5}
    async with await psycopg.AsyncConnection.connect(uri, autocommit=True) as conn:
        await conn.execute(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")
        await conn.execute("SET maintenance_work_mem = '256MB'")
        t = time.perf_counter()
        async with _indexes_built_after(conn, "ai_job", out):
            async with conn.transaction():
                await conn.execute("SET LOCAL session_replication_role = replica")
                await conn.execute(_jobs_sql(len(cols["job_type"])), params)
        out["ai_job_insert_s"] = time.perf_counter() - t
        progress(f"scale: {jobs:,} ai_job rows in {out['ai_job_insert_s']:.1f}s")
        m = jobs * OUTBOX_PER_JOB
        t = time.perf_counter()
        async with _indexes_built_after(conn, "outbox_event", out):
            await conn.execute(_OUTBOX_SQL, {"m": m, "t0": t0, "step": span / max(1, m)})
        out["outbox_event"] = m
        out["outbox_insert_s"] = time.perf_counter() - t
        progress(f"scale: {m:,} outbox_event rows in {out['outbox_insert_s']:.1f}s")
        t = time.perf_counter()
        await conn.execute("VACUUM (ANALYZE) ai_job")
        await conn.execute("VACUUM (ANALYZE) outbox_event")
        await conn.execute("CHECKPOINT")
        out["vacuum_analyze_checkpoint_s"] = time.perf_counter() - t
        cur = await conn.execute(
            "SELECT lifecycle_status, count(*) FROM ai_job GROUP BY 1 ORDER BY 1"
        )
        out["status_counts"] = {r[0]: r[1] for r in await cur.fetchall()}
        cur = await conn.execute(
            "SELECT queue_name, job_type, count(*) FROM ai_job GROUP BY 1, 2 ORDER BY 1, 2"
        )
        out["type_counts"] = {f"{r[0]}/{r[1]}": r[2] for r in await cur.fetchall()}
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE lifecycle_status = 'failed'), "
            "count(*) FILTER (WHERE lifecycle_status IN ('queued', 'running')) "
            "FROM ai_job WHERE user_id = %s",
            (HOT_USER,),
        )
        row = await cur.fetchone()
        assert row is not None
        out["hot_user_failed"], out["hot_user_active"] = row
        cur = await conn.execute(
            "SELECT avg(pg_column_size(input))::int, "
            "pg_size_pretty(pg_total_relation_size('ai_job')), "
            "pg_size_pretty(pg_total_relation_size('outbox_event')) FROM ai_job"
        )
        row = await cur.fetchone()
        assert row is not None
        out["avg_input_bytes"], out["ai_job_total_size"], out["outbox_total_size"] = row
    return out


async def truncate(uri: str) -> None:
    async with await psycopg.AsyncConnection.connect(uri, autocommit=True) as conn:
        await conn.execute(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")
        # Fresh statistics for the empty tables, so the 0-row plans are not planned on a
        # previous size.
        await conn.execute("VACUUM (ANALYZE) ai_job")
        await conn.execute("VACUUM (ANALYZE) outbox_event")
