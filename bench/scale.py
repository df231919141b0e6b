"""The scale figure: the same read queries on empty tables and on a production-sized history.

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

What is measured, at 0 seeded rows and again after seeding, through the engine's own code
(`db.jobs` / `db.outbox` on a pool built by `db.session`):
- each list query the API issues (limit 21 = a page of 20 plus the next-cursor probe), and the
  two counts of a create's quota check, `runs` times after `warmup` runs; p50 / p95;
- EXPLAIN (ANALYZE, BUFFERS) of the exact statement and parameters the code sent (captured from
  the driver), as a custom plan, and as the generic plan a pooled connection settles on once
  psycopg prepares a statement it has run 5 times (PREPARE + plan_cache_mode =
  force_generic_plan); the scan nodes say which index serves it;
- the reconciler's retention page `delete_published(older_than_days=7)` (5,000 rows a page),
  each page committed, and its plan (EXPLAIN ANALYZE inside a rolled-back transaction).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.infra import TABLES, progress
from bench.stats import percentile

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
OUTBOX_RETENTION_DAYS = 7


# ---- seeding ------------------------------------------------------------------------------


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


# ---- statement capture and plans ----------------------------------------------------------


class StatementCapture:
    """The statements (and parameters) the driver sends while `on` is set."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.on = False
        self.items: list[tuple[str, Any]] = []
        event.listen(engine.sync_engine, "before_cursor_execute", self._hook)

    def _hook(self, conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if self.on:
            self.items.append((statement, parameters))


_SCAN = re.compile(
    r"(?P<kind>Index Only Scan|Index Scan|Bitmap Heap Scan|Bitmap Index Scan|Seq Scan)"
    r"(?P<backward> Backward)?(?: using (?P<index>\S+))?(?: on (?P<rel>\S+))?"
)


def plan_summary(lines: list[str]) -> dict[str, Any]:
    """The scan nodes, sorts, top-node buffers and execution time of an EXPLAIN ANALYZE text."""
    scans: list[str] = []
    indexes: list[str] = []
    seq: list[str] = []
    sorts = 0
    for line in lines:
        body = line.strip().removeprefix("->").strip()
        if body.startswith(("Sort ", "Sort(", "Incremental Sort")):
            sorts += 1
        m = _SCAN.match(body)
        if not m:
            continue
        kind = m.group("kind")
        idx = m.group("index") or (m.group("rel") if kind == "Bitmap Index Scan" else None)
        scans.append(
            f"{kind}{m.group('backward') or ''}"
            + (f" using {idx}" if idx else "")
            + (f" on {m.group('rel')}" if m.group("rel") and kind != "Bitmap Index Scan" else "")
        )
        if kind == "Seq Scan":
            seq.append(m.group("rel") or "?")
        elif idx:
            indexes.append(idx)
    buffers = None
    for line in lines:
        if "Buffers:" in line:
            buffers = line.strip().removeprefix("Buffers:").strip()
            break
    exec_ms = None
    filtered = 0
    for line in lines:
        m3 = re.match(r"\s*Rows Removed by Filter: ([0-9.]+)", line)
        if m3:
            filtered += int(float(m3.group(1)))
        m2 = re.match(r"\s*Execution Time: ([0-9.]+) ms", line)
        if m2:
            exec_ms = float(m2.group(1))
    if seq:
        verdict = "Seq Scan on " + ", ".join(seq)
    elif indexes:
        verdict = "index: " + ", ".join(dict.fromkeys(indexes))
        if any(s.startswith("Bitmap") for s in scans):
            verdict += " (bitmap)"
        if sorts:
            verdict += " + Sort"
    else:
        verdict = "no scan node"
    return {
        "scans": scans,
        "indexes": list(dict.fromkeys(indexes)),
        "seq_scans": seq,
        "sorts": sorts,
        "rows_removed_by_filter": filtered,
        "top_buffers": buffers,
        "execution_ms": exec_ms,
        "uses_index": bool(indexes) and not seq,
        "verdict": verdict,
    }


def _positional(statement: str) -> tuple[str, list[str]]:
    """`%(name)s` placeholders as `$n` (same name, same n), and the names in order."""
    names: list[str] = []

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", sub, statement), names


async def _lines(conn: psycopg.AsyncConnection[Any], query: Any, params: Any = None) -> list[str]:
    cur = await conn.execute(query, params)
    return [str(r[0]) for r in await cur.fetchall()]


async def explain(
    conn: psycopg.AsyncConnection[Any], statement: str, params: Any, *, rollback: bool = False
) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of one captured statement: the custom plan (the parameters
    bound, as on a statement's first executions) and the generic plan (as once prepared)."""
    out: dict[str, Any] = {"statement": " ".join(statement.split())}
    async with conn.transaction(force_rollback=True):
        custom = await _lines(conn, "EXPLAIN (ANALYZE, BUFFERS) " + statement, params)
    out["custom_plan"] = custom
    out["custom"] = plan_summary(custom)
    if rollback or not isinstance(params, dict) or not params:
        return out
    positional, names = _positional(statement)
    await conn.execute(sql.SQL("PREPARE bench_scale_q AS {}").format(sql.SQL(positional)))
    try:
        async with conn.transaction(force_rollback=True):
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            q = sql.SQL("EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_scale_q({})").format(
                sql.SQL(", ").join(sql.Literal(params[n]) for n in names)
            )
            generic = await _lines(conn, q)
    finally:
        await conn.execute("DEALLOCATE bench_scale_q")
    out["generic_plan"] = generic
    out["generic"] = plan_summary(generic)
    return out


# ---- the queries --------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    key: str
    label: str
    run: Callable[[Any], Awaitable[Any]]  # given a session, returns rows or a count
    write: bool = False  # a delete: runs in its own committed transaction


def queries() -> list[Query]:
    from db import budgets as budgets_db
    from db import jobs as jobs_db
    from db import outbox as outbox_db
    from db.jobs import JobFilter
    from jobs.costs import utc_day_start, utc_month_start

    def lister(f: JobFilter) -> Callable[[Any], Awaitable[Any]]:
        async def run(s: Any) -> Any:
            return await jobs_db.list_jobs(s, f, after=None, limit=LIST_LIMIT)

        return run

    async def active(s: Any) -> Any:
        return (await budgets_db.standing(s, HOT_USER, active=True)).active_jobs

    async def today(s: Any) -> Any:
        day = utc_day_start(datetime.now(UTC))
        return (await budgets_db.standing(s, HOT_USER, created_since=[day])).jobs_since[0]

    async def month(s: Any) -> Any:
        month = utc_month_start(datetime.now(UTC))
        return (await budgets_db.standing(s, HOT_USER, created_since=[month])).jobs_since[0]

    async def retention(s: Any) -> Any:
        return await outbox_db.delete_published(s, older_than_days=OUTBOX_RETENTION_DAYS)

    return [
        Query(
            "user_failed",
            "GET /api/ai/jobs?status=failed (the 1/5-of-all-jobs user)",
            lister(JobFilter(user_id=HOT_USER, status="failed")),
        ),
        Query(
            "admin_failed",
            "GET /admin-api/ai/jobs?status=failed",
            lister(JobFilter(status="failed")),
        ),
        Query(
            "admin_queue",
            "GET /admin-api/ai/jobs?queueName=ai-background",
            lister(JobFilter(queue_name="ai-background")),
        ),
        Query(
            "admin_type",
            "GET /admin-api/ai/jobs?jobType=quiz_generation",
            lister(JobFilter(job_type="quiz_generation")),
        ),
        Query(
            "admin_user",
            "GET /admin-api/ai/jobs?userId=<that user>",
            lister(JobFilter(user_id=HOT_USER)),
        ),
        Query("quota_active", "create quota: active jobs of that user", active),
        Query("quota_day", "create quota: jobs that user created this UTC day", today),
        Query("quota_month", "create quota: jobs that user created this UTC month", month),
        Query(
            "outbox_retention",
            f"reconciler: delete_published(older_than_days={OUTBOX_RETENTION_DAYS}), one page",
            retention,
            write=True,
        ),
    ]


def _size(result: Any) -> int:
    return len(result) if isinstance(result, list) else int(result)


async def measure(
    engine: AsyncEngine,
    capture: StatementCapture,
    uri: str,
    *,
    runs: int,
    warmup: int,
    write_pages: int,
) -> dict[str, Any]:
    """Every query of `queries()` timed (wall time of session checkout, statement, release)
    and explained."""
    from db.session import make_sessionmaker

    sm = make_sessionmaker(engine)
    out: dict[str, Any] = {}
    async with await psycopg.AsyncConnection.connect(uri, autocommit=True) as conn:
        for q in queries():
            n, w = (write_pages, 1) if q.write else (runs, warmup)
            samples: list[float] = []
            result: Any = None
            for i in range(w + n):
                t = time.perf_counter()
                if q.write:
                    async with sm.begin() as s:
                        result = await q.run(s)
                else:
                    async with sm() as s:
                        result = await q.run(s)
                if i >= w:
                    samples.append(time.perf_counter() - t)
            capture.items.clear()
            capture.on = True
            try:
                async with sm() as s:
                    await q.run(s)
                    await s.rollback()
            finally:
                capture.on = False
            stmt, params = capture.items[0]
            ms = [x * 1e3 for x in samples]
            out[q.key] = {
                "label": q.label,
                "runs": len(ms),
                "p50_ms": percentile(ms, 50),
                "p95_ms": percentile(ms, 95),
                "max_ms": max(ms) if ms else None,
                "rows" if not q.write else "rows_deleted_last_page": _size(result),
                # The second EXPLAIN is kept: the first pays the new connection's cold caches.
                "explain": [await explain(conn, stmt, params, rollback=q.write) for _ in range(2)][
                    -1
                ],
            }
            e = out[q.key]["explain"]
            progress(
                f"scale: {q.key:16s} p50 {out[q.key]['p50_ms']:7.2f} ms "
                f"p95 {out[q.key]['p95_ms']:7.2f} ms; {e['custom']['verdict']}"
            )
    return out


# ---- the table ----------------------------------------------------------------------------


def _ms(row: dict[str, Any]) -> str:
    return f"{row['p50_ms']:.2f} / {row['p95_ms']:.2f}"


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def render(fig: dict[str, Any]) -> list[str]:
    """Markdown lines for the scale figure (empty when it did not run)."""
    if "seeded" not in fig or "empty" not in fig:
        return []
    seed = fig["seed"]
    n = seed["jobs"]
    lines = [
        "",
        f"Scale (7): {n:,} seeded ai_job rows ({seed['users']:,} users, one owning "
        f"{seed['hot_user_jobs']:,}; {seed['ai_job_total_size']} with indexes) and "
        f"{seed['outbox_event']:,} published outbox rows ({seed['outbox_total_size']}); "
        f"p50 / p95 ms of {next(iter(fig['seeded'].values()))['runs']} runs each after a "
        "warm-up, through the engine's query code on a pool (checkout, statement, rows "
        "decoded into JobRow, release). Server ms: the Execution Time of EXPLAIN (ANALYZE, "
        "BUFFERS) of the statement the code sent; plans custom (parameters bound) and generic "
        "(as once prepared); full plans in the JSON.",
        "",
        f"| Query | at 0 rows | at {n:,} | p50 ratio | Server ms, 0 → {n:,} | Rows "
        f"| Plan at {n:,} (custom) | Buffers | Generic plan | Index? |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, row in fig["seeded"].items():
        empty = fig["empty"].get(key)
        ex = row["explain"]
        custom = ex["custom"]
        generic = ex.get("generic")
        if generic is None:
            gtext = "—"
        elif generic["scans"] == custom["scans"] and generic["sorts"] == custom["sorts"]:
            gtext = "same"
        else:
            gtext = "; ".join(generic["scans"]) + (" + Sort" if generic["sorts"] else "")
        ok = custom["uses_index"] and (generic is None or generic["uses_index"])
        if ok:
            verdict = "yes" + (" (+ Sort)" if custom["sorts"] else "")
        else:
            bad = custom if not custom["uses_index"] else generic
            assert bad is not None
            verdict = f"**NO**: {bad['verdict']}" + (
                " (generic plan)" if custom["uses_index"] else ""
            )
        rows = row.get("rows", row.get("rows_deleted_last_page"))
        e0 = empty["explain"]["custom"]["execution_ms"] if empty else None
        e1 = custom["execution_ms"]
        server = f"{_f(e0)} → {_f(e1)}"
        lines.append(
            "| "
            + " | ".join(
                (
                    row["label"],
                    _ms(empty) if empty else "—",
                    _ms(row),
                    f"{row['p50_ratio_to_empty']:.2f}" if row.get("p50_ratio_to_empty") else "—",
                    server,
                    str(rows) + (" deleted" if "rows_deleted_last_page" in row else ""),
                    "; ".join(custom["scans"])
                    + (" + Sort" if custom["sorts"] else "")
                    + (
                        f" (filter dropped {custom['rows_removed_by_filter']} rows)"
                        if custom["rows_removed_by_filter"]
                        else ""
                    ),
                    custom["top_buffers"] or "—",
                    gtext,
                    verdict,
                )
            )
            + " |"
        )
    return lines
