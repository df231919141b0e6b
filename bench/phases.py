"""The measurements of `python -m bench`, one phase at a time; each phase stops its
subprocesses in a `finally`, and a failing figure is recorded while the run goes on.

  A. baseline workers (one-activity and five-stage shape) + engine stack with ONE worker:
     throughput (1, and commits for 5) interleaved with both baselines, relay latency (3)
     interleaved with direct starts, latency (2);
  B. pgbench on the same PostgreSQL, nothing else running (5);
  C. engine stack with TWO workers: throughput and the CPU split per job (6);
  D. the API server: real routes interleaved with bare routes (4), driven by wrk; then each
     route's round trips to PostgreSQL (`bench/statements.py`);
  E. the scale figure: list and quota queries on empty tables, then on a seeded history (7).
  F. the fairness figure: a relay + worker stack with fairness on, then one with it off (8).
  G. the tracing figure: one stack per sampling mode (off, 10 %, 100 %), exporting (9).
  0. (first) the idle figure: the four processes of `aijobs dev`, nothing queued (10).

Phase A is `bench/one_worker.py` (figure 1 itself `bench/throughput.py`), D `bench/api_phase.py`,
F `bench/fairness.py`, G `bench/tracing.py`, the idle figure `bench/idle.py`; B, C and E, and the
figures derived from several phases, are here. What each single run measures is in
`bench/figures.py`; the table is `bench/report.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from typing import Any

from bench.infra import DB_NAME, Admin, EngineDb, EngineKnobs, EngineStack, Servers
from bench.procs import process_cpu_s, progress, tree_cpu_s
from bench.report import Results, guarded, server_settings, versions
from bench.stats import median, ratio
from bench.throughput import ENGINE_OWN_CPU, SERVER_CPU, CpuMeter, cpu_delta, read_cpu

SCALING_IDLE_PROBE_S = 3.0
SCALING_SETTLE_S = 2.0
SCALE_WARMUP = 5  # untimed runs of each scale query before its timed runs
SCALE_PAGES = 5  # timed retention pages (after one untimed)


async def run_all(args: argparse.Namespace, sv: Servers, res: Results) -> None:
    from temporalio.client import Client

    from bench.api_phase import phase_api
    from bench.figures import Ctx
    from bench.one_worker import phase_one_worker
    from db.session import make_engine, make_sessionmaker
    from jobs.service import CreatePolicy, JobService
    from jobs.types import default_catalog

    client = await Client.connect(sv.temporal_address, namespace="default")
    admin = Admin(sv.admin_uri)
    edb = EngineDb(sv.database_url)
    await admin.open()
    await edb.open()
    # The bench's own pool, built like the engine's (db/session.py), sized for its creates.
    engine = make_engine(sv.database_url, pool_size=args.concurrency, max_overflow=8)
    svc = JobService(
        make_sessionmaker(engine),
        default_catalog(),
        CreatePolicy(max_active_jobs=0, max_jobs_per_day=0, synthetic_public=True),
    )
    ctx = Ctx(client=client, svc=svc, edb=edb, admin=admin, concurrency=args.concurrency, watch=[])
    knobs = EngineKnobs(
        interactive_concurrency=args.interactive_concurrency,
        log_level=args.log_level,
        extra_env=args.extra_env,
    )
    try:
        res.data["versions"] = await versions(admin)
        res.data["server_settings"] = await server_settings(admin)
        if "idle" in args.want:  # first: a fresh Temporal server, no leftovers of other phases
            from bench.idle import phase_idle

            await guarded(res, "idle", lambda: phase_idle(ctx, args, sv, knobs, res))
        if args.want & {"throughput", "latency", "relay"}:
            await phase_one_worker(ctx, args, sv, knobs, res)
        if "postgres" in args.want:
            await guarded(res, "postgres", lambda: phase_pgbench(ctx, args, sv, res))
        if "scaling" in args.want:
            await guarded(res, "scaling", lambda: phase_two_workers(ctx, args, sv, knobs, res))
        if "api" in args.want:
            await guarded(res, "api", lambda: phase_api(ctx, args, sv, knobs, res))
        if "scale" in args.want:
            await guarded(res, "scale", lambda: phase_scale(args, sv, res))
        if "fairness" in args.want:
            from bench.fairness import phase_fairness

            await guarded(res, "fairness", lambda: phase_fairness(ctx, args, sv, knobs, res))
        if "tracing" in args.want:
            from bench.tracing import phase_tracing

            await guarded(res, "tracing", lambda: phase_tracing(ctx, args, sv, knobs, res))
        derive(res)
    finally:
        await engine.dispose()
        await edb.close()
        await admin.close()


async def phase_pgbench(ctx: Any, args: argparse.Namespace, sv: Servers, res: Results) -> None:
    from bench.figures import pgbench, pgbench_script_text

    script = sv.base / "create_tx.sql"
    script.write_text(pgbench_script_text())
    kw = {
        "clients": args.pgbench_clients,
        "threads": args.pgbench_threads,
    }
    await ctx.edb.truncate()
    warm = max(1, args.pgbench_seconds // 3)
    progress(f"pgbench: warm-up {warm}s, then {args.reps} x {args.pgbench_seconds}s")
    await pgbench(sv.socket_dir, DB_NAME, str(script), seconds=warm, **kw)
    runs = []
    for r in range(args.reps):
        run = await pgbench(sv.socket_dir, DB_NAME, str(script), seconds=args.pgbench_seconds, **kw)
        progress(f"pgbench rep {r + 1}/{args.reps}: {run['tps']:.0f} tps")
        runs.append(run)
    await ctx.edb.truncate()
    pg = res.fig("postgres")
    pg["pgbench"] = {
        "reps": runs,
        "median_tps": median([x["tps"] for x in runs]),
        "script": pgbench_script_text(),
        "options": f"-n -M prepared -c {kw['clients']} -j {kw['threads']} "
        f"-T {args.pgbench_seconds}",
    }


async def phase_two_workers(
    ctx: Any, args: argparse.Namespace, sv: Servers, knobs: EngineKnobs, res: Results
) -> None:
    from bench.figures import engine_throughput

    stack = EngineStack("engine2", sv, knobs, workers=2)
    try:
        await stack.start(ctx.client, ctx.admin)
        ctx.watch = list(stack.procs)
        progress(f"scaling: warm-up ({args.warmup_jobs} jobs, 2 workers)")
        await engine_throughput(ctx, args.warmup_jobs, "warm2")
        # The same parties as figure 1's engine side, so the CPU split of 1 and 2 workers compare.
        meter: CpuMeter = {
            "engine_worker": lambda: sum(process_cpu_s(p.pid) for p in stack.workers),
            "relay": lambda: process_cpu_s(stack.relay.pid),
            "temporal": lambda: process_cpu_s(sv.temporal.process.pid),
            "postgres": lambda: tree_cpu_s(sv.pg.pid),
        }
        cpu0, t0 = read_cpu(meter), time.perf_counter()
        await asyncio.sleep(SCALING_IDLE_PROBE_S)
        idle_s = time.perf_counter() - t0
        idle_cpu = {k: v / idle_s for k, v in cpu_delta(cpu0, read_cpu(meter)).items()}
        runs = []
        for r in range(args.reps):
            cpu0, t0 = read_cpu(meter), time.perf_counter()
            e = await engine_throughput(ctx, args.jobs, f"s{r}")
            # Trailing completions land in a short settle, whose idle CPU is subtracted.
            await asyncio.sleep(SCALING_SETTLE_S)
            extra_s = (time.perf_counter() - t0) - e["elapsed_s"]
            e["cpu_s"] = {
                k: v - idle_cpu[k] * extra_s for k, v in cpu_delta(cpu0, read_cpu(meter)).items()
            }
            e["cpu_s_per_job"] = {k: v / args.jobs for k, v in e["cpu_s"].items()}
            progress(
                f"scaling rep {r + 1}/{args.reps}: 2 workers {e['jobs_per_s']:.1f} jobs/s, CPU "
                f"ms/job workers {1e3 * e['cpu_s_per_job']['engine_worker']:.2f}, total "
                f"{1e3 * sum(e['cpu_s_per_job'].values()):.2f}"
            )
            runs.append(e)
    finally:
        ctx.watch = []
        stack.stop()
        res.record_procs(stack.procs)
    f = res.fig("scaling")
    f["two_workers"] = {
        "reps": runs,
        "median_jobs_per_s": median([e["jobs_per_s"] for e in runs]),
        "median_cpu_s_per_job": {
            k: median([e["cpu_s_per_job"][k] for e in runs]) for k in runs[0]["cpu_s_per_job"]
        },
    }


async def phase_scale(args: argparse.Namespace, sv: Servers, res: Results) -> None:
    from bench import scale, scale_seed
    from db.session import make_engine

    # A pool built like the engine's; two connections, as the queries run one at a time.
    engine = make_engine(sv.database_url, pool_size=2, max_overflow=0)
    capture = scale.StatementCapture(engine)
    f = res.fig("scale")
    f["method"] = (
        "db.jobs / db.outbox through a db.session pool; each sample "
        "is session checkout + statement + release; list limit 21"
    )
    kw = {"runs": args.scale_runs, "warmup": SCALE_WARMUP, "write_pages": SCALE_PAGES}
    try:
        await scale_seed.truncate(sv.database_url)
        progress("scale: queries on empty tables")
        f["empty"] = await scale.measure(engine, capture, sv.database_url, **kw)
        progress(f"scale: seeding {args.scale_jobs:,} jobs over {args.scale_users:,} users")
        f["seed"] = await scale_seed.seed(
            sv.database_url, jobs=args.scale_jobs, users=args.scale_users
        )
        progress("scale: queries on the seeded tables")
        f["seeded"] = await scale.measure(engine, capture, sv.database_url, **kw)
    finally:
        await engine.dispose()
        with contextlib.suppress(Exception):
            await scale_seed.truncate(sv.database_url)
    for key, row in f["seeded"].items():
        row["p50_ratio_to_empty"] = ratio(row["p50_ms"], f["empty"][key]["p50_ms"])
    f["all_use_an_index"] = all(
        r["explain"]["custom"]["uses_index"]
        and r["explain"].get("generic", r["explain"]["custom"])["uses_index"]
        for r in f["seeded"].values()
    )


def derive(res: Results) -> None:
    figs = res.data["figures"]
    pg, tp, sc = figs.get("postgres", {}), figs.get("throughput", {}), figs.get("scaling", {})
    if "pgbench" in pg and "engine_commits_per_s" in pg:
        pg["load_pct"] = 100.0 * pg["engine_commits_per_s"] / pg["pgbench"]["median_tps"]
        pg["load_target"] = "<= 25 %"
        pg["load_met"] = pg["load_pct"] <= 25.0
    if "two_workers" in sc and "engine" in tp:
        sc["one_worker_median_jobs_per_s"] = tp["engine"]["median_jobs_per_s"]
        sc["ratio"] = ratio(
            sc["two_workers"]["median_jobs_per_s"], tp["engine"]["median_jobs_per_s"]
        )
        sc["target"] = ">= 1.4"
        sc["met"] = sc["ratio"] >= 1.4
        # What one core buys: jobs/s over the machine's cores, and jobs per CPU second of
        # every party (worker(s), relay, Temporal server, PostgreSQL) from the measured split.
        cores = res.data["machine"]["usable_cores"]
        one_cpu = {
            k: tp["engine"]["median_cpu_s_per_job"][k] for k in (*ENGINE_OWN_CPU, *SERVER_CPU)
        }
        two_cpu = sc["two_workers"]["median_cpu_s_per_job"]
        for key, jps, cpu in (
            ("one_worker", sc["one_worker_median_jobs_per_s"], one_cpu),
            ("two_workers", sc["two_workers"]["median_jobs_per_s"], two_cpu),
        ):
            total = sum(cpu.values())
            sc[f"{key}_split"] = {
                "cpu_ms_per_job": {k: 1e3 * v for k, v in cpu.items()},
                "total_cpu_ms_per_job": 1e3 * total,
                "share": {k: v / total for k, v in cpu.items()},
                "jobs_per_s_per_core": jps / cores,
                "jobs_per_cpu_s": 1 / total,
                "cores_busy": jps * total,
            }
    procs = res.data["processes"]

    def peak(prefix: str) -> float | None:
        vals = [v["peak_rss_mb"] for k, v in procs.items() if prefix in k and v["peak_rss_mb"]]
        return max(vals) if vals else None

    res.data["peak_rss_mb"] = {
        "engine_worker": peak("-worker"),
        "relay": peak("-relay"),
        "api": peak("api"),
        "baseline_worker": peak("baseline-worker"),
        "shape_worker": peak("shape-worker"),
    }
