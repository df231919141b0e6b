"""The scale figure: the same read queries on empty tables and on a production-sized history.

The history it measures on is seeded by `bench/scale_seed.py` (`seed`, `truncate`).

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

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.procs import progress
from bench.scale_seed import HOT_USER
from bench.stats import percentile
from engine.retention_days import DEFAULT_RETENTION_DAYS

LIST_LIMIT = 21
OUTBOX_RETENTION_DAYS = DEFAULT_RETENTION_DAYS["outbox"]


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
