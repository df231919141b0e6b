"""`python -m bench.usage`: what the usage API's reads cost over a large usage log
(docs/benchmarks.md, "The usage read figure").

It starts an embedded PostgreSQL of its own (no Temporal: nothing here runs a job), loads
`--rows` `ai_usage_log` rows (default 10M) in SQL with `INSERT ... SELECT generate_series`: one
job per `CALLS_PER_JOB` calls, `--users` users (default 10k), `DAYS` UTC days, 5 job types, 3
models, one call in 50 failed; then builds the matching `ai_usage_daily` rollup with one
INSERT ... SELECT (the migration's backfill) and checks it against the log (both in
`bench/usage_seed.py`). Then it times, with the repository's own SQL (`db/usage.py`) through the
engine's pool:

- own usage: one user over 30 days, grouped by day, jobType and model;
- admin usage: every user over 30 days, grouped by user, jobType, model, day, credentialMode;
- job usage: one job's row and its calls per attempt;
- the baseline: the same admin reads computed straight from `ai_usage_log` (joined to `ai_job`
  for the job type), which is what the reads cost without the rollup.

Each read runs `--repeat` times after one warm-up; the table shows p50 ms. Each read's plan is
taken once with EXPLAIN (ANALYZE, BUFFERS) and must use an index of its table (the baseline is
reported, not required to). `--rows N` loads a smaller log on a small machine: say so with the
figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.usage_seed import check_rollup, load
from db.session import SessionMaker, make_engine, make_sessionmaker
from db.usage import (
    JOB_ATTEMPTS_SQL,
    Grouping,
    UsageFilter,
    grouped_usage,
    grouped_usage_sql,
    job_attempts,
    job_money,
    usage_params,
)

RANGE_DAYS = 30
OWN: tuple[Grouping, ...] = ("day", "jobType", "model")
ADMIN: tuple[Grouping, ...] = ("user", "jobType", "model", "day", "credentialMode")

_INDEXED = ("Index Scan", "Index Only Scan", "Bitmap Index Scan")


@dataclass
class Read:
    name: str
    table: str  # what it reads: rollup, log (the baseline), job
    p50_ms: float
    samples_ms: list[float]
    indexes: list[str]  # the indexes its plan used
    scans: list[str]  # its plan's scan nodes (e.g. "Seq Scan on ai_usage_daily")
    plan_ms: float  # EXPLAIN ANALYZE's execution time
    shared_hit: int
    shared_read: int
    rows: int  # result rows


@dataclass
class Figures:
    rows: int
    users: int
    jobs: int
    rollup_rows: int
    load_s: float
    rollup_s: float
    reads: list[Read] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)


def _progress(msg: str) -> None:
    from bench.procs import progress

    progress(msg)


def _walk(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out.extend(_walk(child))
    return out


async def explain(sm: SessionMaker, sql: str, params: dict[str, Any]) -> dict[str, Any]:
    async with sm() as s:
        doc = (
            await s.execute(text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql), params)
        ).scalar_one()
    top: dict[str, Any] = doc[0]
    return top


async def timed(
    sm: SessionMaker, read: Callable[[Any], Awaitable[int]], repeat: int
) -> tuple[list[float], int]:
    """Run `read` once to warm up, then `repeat` times, each in a pooled session of its own;
    the samples in ms and the result rows."""
    rows = 0
    samples: list[float] = []
    for k in range(repeat + 1):
        async with sm() as s:
            start = time.perf_counter()
            rows = await read(s)
            if k:
                samples.append((time.perf_counter() - start) * 1000)
    return samples, rows


@dataclass
class _Reader:
    """Times one read, explains its statement, and records it in the figures."""

    sm: SessionMaker
    figures: Figures

    async def add(
        self,
        name: str,
        table: str,
        sql: str,
        params: dict[str, Any],
        read: Callable[[Any], Awaitable[int]],
        n: int,
        *,
        need_index: bool = True,
    ) -> Read:
        from bench.stats import median

        samples, rows = await timed(self.sm, read, n)
        plan = await explain(self.sm, sql, params)
        nodes = _walk(plan["Plan"])
        r = Read(
            name=name,
            table=table,
            p50_ms=round(median(samples), 3),
            samples_ms=[round(x, 3) for x in samples],
            indexes=sorted({x["Index Name"] for x in nodes if x["Node Type"] in _INDEXED}),
            scans=sorted(
                {
                    f"{x['Node Type']} on {x['Relation Name']}"
                    for x in nodes
                    if "Scan" in x["Node Type"] and "Relation Name" in x
                }
            ),
            plan_ms=round(float(plan["Execution Time"]), 3),
            shared_hit=int(plan["Plan"].get("Shared Hit Blocks", 0)),
            shared_read=int(plan["Plan"].get("Shared Read Blocks", 0)),
            rows=rows,
        )
        _progress(f"usage: {name}: p50 {r.p50_ms} ms, {rows} rows, indexes {r.indexes}")
        if need_index and not r.indexes:
            raise SystemExit(f"{name}: its plan uses no index")
        self.figures.reads.append(r)
        return r


def _grouped(f: UsageFilter, g: Grouping) -> Callable[[Any], Awaitable[int]]:
    async def read(s: Any) -> int:
        return len(await grouped_usage(s, f, g))

    return read


def _from_log(f: UsageFilter, g: Grouping) -> Callable[[Any], Awaitable[int]]:
    async def read(s: Any) -> int:
        rows = await s.execute(text(grouped_usage_sql(g, f, from_log=True)), usage_params(f))
        return len(rows.all())

    return read


async def measure(sm: SessionMaker, *, repeat: int, baseline_repeat: int, figures: Figures) -> None:
    from bench.stats import ratio

    async with sm() as s:
        day_max = (await s.execute(text("SELECT max(day) FROM ai_usage_daily"))).scalar_one()
        # A user with calls, and one of their jobs with calls in two attempts.
        user = "user-1" if figures.users > 1 else "user-0"
        job = (
            await s.execute(
                text("SELECT job_id FROM ai_usage_log WHERE user_id = :u LIMIT 1"), {"u": user}
            )
        ).scalar_one()
    end = day_max
    start = end - timedelta(days=RANGE_DAYS - 1)
    own = UsageFilter(start=start, end=end, user_id=user)
    anyone = UsageFilter(start=start, end=end)

    add = _Reader(sm, figures).add

    for g in OWN:
        await add(
            f"own {g}",
            "rollup",
            grouped_usage_sql(g, own),
            usage_params(own),
            _grouped(own, g),
            repeat,
        )
    for g in ADMIN:
        rolled = await add(
            f"admin {g}",
            "rollup",
            grouped_usage_sql(g, anyone),
            usage_params(anyone),
            _grouped(anyone, g),
            repeat,
            # A third of the rollup's days: the planner may rightly prefer one sequential pass
            # (reported in the table, not required either way).
            need_index=False,
        )
        base = await add(
            f"admin {g} from the log",
            "log",
            grouped_usage_sql(g, anyone, from_log=True),
            usage_params(anyone),
            _from_log(anyone, g),
            baseline_repeat,
            need_index=False,
        )
        figures.ratios[g] = round(ratio(base.p50_ms, rolled.p50_ms), 1)

    async def job_read(s: Any) -> int:
        job_id = uuid.UUID(str(job))
        money = await job_money(s, job_id)
        assert money is not None
        return len(await job_attempts(s, job_id))

    await add("job usage", "job", JOB_ATTEMPTS_SQL, {"j": job}, job_read, repeat)


def render(f: Figures) -> str:
    lines = [
        f"ai_usage_log rows: {f.rows:,}; users: {f.users:,}; jobs: {f.jobs:,}; "
        f"ai_usage_daily rows: {f.rollup_rows:,}; load {f.load_s:.0f} s, rollup {f.rollup_s:.0f} s",
        "",
        "| read | reads | p50 ms | plan ms | scans (indexes) | result rows |",
        "|---|---|---:|---:|---|---:|",
    ]
    for r in f.reads:
        idx = "; ".join(r.scans) + (f" ({', '.join(r.indexes)})" if r.indexes else "")
        lines.append(
            f"| {r.name} | {r.table} | {r.p50_ms:.2f} | {r.plan_ms:.2f} | {idx} | {r.rows:,} |"
        )
    lines.append("")
    lines.append(
        "admin read from the log ÷ from the rollup (p50): "
        + ", ".join(f"{g} {v}x" for g, v in f.ratios.items())
    )
    return "\n".join(lines)


async def run_on(
    database_url: str, *, rows: int, users: int, repeat: int, baseline_repeat: int
) -> Figures:
    """Load and measure on `database_url`, whose ai_job, ai_usage_log and ai_usage_daily are
    expected empty (the bench's own server, or a test's clean database)."""
    engine = make_engine(database_url, pool_size=2)
    sm = make_sessionmaker(engine)
    try:
        jobs, load_s, rollup_s, rollup_rows = await load(engine, sm, rows, users)
        await check_rollup(sm)
        figures = Figures(rows, users, jobs, rollup_rows, round(load_s, 1), round(rollup_s, 1))
        await measure(sm, repeat=repeat, baseline_repeat=baseline_repeat, figures=figures)
        return figures
    finally:
        await engine.dispose()


async def run(args: argparse.Namespace) -> Figures:
    import psycopg

    from db.migrate import upgrade
    from runtime.embedded import start_postgres

    base = Path(tempfile.mkdtemp(prefix="aijobs-bench-usage-"))
    base.chmod(0o755)  # the embedded server may run as its own system user
    pg = None
    try:
        _progress(f"starting PostgreSQL in {base}")
        pg = start_postgres(base / "pg")
        with psycopg.connect(pg.uri, autocommit=True) as c:
            # A bulk load: fewer checkpoints; durability is not what is measured.
            c.execute("ALTER SYSTEM SET max_wal_size = '8GB'")
            c.execute("ALTER SYSTEM SET synchronous_commit = off")
            c.execute("ALTER SYSTEM SET maintenance_work_mem = '256MB'")
            c.execute("SELECT pg_reload_conf()")
            c.execute("CREATE DATABASE aijobs_bench_usage")
        url = pg.uri.replace("/postgres?", "/aijobs_bench_usage?")
        upgrade(url)
        return await run_on(
            url,
            rows=args.rows,
            users=args.users,
            repeat=args.repeat,
            baseline_repeat=args.baseline_repeat,
        )
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.usage",
        description="Time the usage API's reads over a large usage log and its daily rollup.",
    )
    p.add_argument("--rows", type=int, default=10_000_000, help="ai_usage_log rows (10M)")
    p.add_argument("--users", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=20, help="timed runs of each rollup read")
    p.add_argument(
        "--baseline-repeat", type=int, default=3, help="timed runs of each read from the log"
    )
    p.add_argument("--output", help="write the figures as JSON here")
    args = p.parse_args(argv)
    figures = asyncio.run(run(args))
    print(render(figures))
    if args.output:
        Path(args.output).write_text(json.dumps(asdict(figures), indent=2, default=str))


if __name__ == "__main__":
    main()
