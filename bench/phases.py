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

What each single run measures is in `bench/figures.py`; the table is `bench/report.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.infra import (
    BENCH_JWT_SECRET,
    DB_NAME,
    STATS_SETTLE_S,
    Admin,
    EngineDb,
    EngineKnobs,
    EngineStack,
    Servers,
    engine_env,
    wait_pollers,
)
from bench.procs import (
    Proc,
    check_alive,
    child_env,
    process_cpu_s,
    progress,
    stop_group,
    tree_cpu_s,
)
from bench.report import Results, server_settings, versions
from bench.stats import median, ratio
from bench.wrk import WRK_THREADS

IDLE_PROBE_S = 6.0
SCALING_IDLE_PROBE_S = 3.0
SCALING_SETTLE_S = 2.0
SCALE_WARMUP = 5  # untimed runs of each scale query before its timed runs
SCALE_PAGES = 5  # timed retention pages (after one untimed)
API_GET_JOBS = 256  # seeded jobs the GET routes read, one user each
API_POST_USERS = 4096  # creating users, so per-user quotas never bind


async def guarded(res: Results, name: str, run: Callable[[], Awaitable[None]]) -> None:
    """A failing figure is recorded and the run goes on with the next one."""
    try:
        await run()
    except Exception as exc:
        progress(f"{name}: FAILED: {exc!r}")
        res.error(name, exc)


async def run_all(args: argparse.Namespace, sv: Servers, res: Results) -> None:
    from temporalio.client import Client

    from bench.figures import Ctx
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


def baseline_worker(
    args: argparse.Namespace, sv: Servers, queue: str, *, shape: str = "one"
) -> Proc:
    """`shape` "one": the one-activity bare workflow; "five": the engine's stage shape."""
    return Proc(
        "baseline-worker" if shape == "one" else "shape-worker",
        [
            sys.executable,
            "-m",
            "bench.baseline",
            "worker",
            "--shape",
            shape,
            "--address",
            sv.temporal_address,
            "--task-queue",
            queue,
            "--max-concurrent-activities",
            str(args.interactive_concurrency),
            "--max-concurrent-local-activities",
            "200",
            "--max-concurrent-workflow-tasks",
            "100",
        ],
        child_env({}),
        sv.log_dir,
    )


async def phase_one_worker(
    ctx: Any, args: argparse.Namespace, sv: Servers, knobs: EngineKnobs, res: Results
) -> None:
    base_q = f"bench-baseline-{uuid.uuid4().hex[:8]}"
    shape_q = f"bench-shape-{uuid.uuid4().hex[:8]}"
    baseline = baseline_worker(args, sv, base_q)
    bare = [baseline]
    if "throughput" in args.want:
        bare.append(baseline_worker(args, sv, shape_q, shape="five"))
    stack = EngineStack("engine1", sv, knobs, workers=1)
    try:
        for b in bare:
            b.start()
        await stack.start(ctx.client, ctx.admin)
        for b, q in zip(bare, (base_q, shape_q), strict=False):
            await wait_pollers(ctx.client, q, 1, time.monotonic() + 60, [b])
        ctx.watch = [*stack.procs, *bare]
        if "throughput" in args.want:
            queues = {"baseline": base_q, "shape": shape_q}
            meter = throughput_cpu_meter(sv, stack, baseline, bare[1])
            await guarded(res, "throughput", lambda: fig_throughput(ctx, args, queues, res, meter))
        if "relay" in args.want:
            await guarded(res, "relay", lambda: fig_relay(ctx, args, base_q, res))
        if "latency" in args.want:
            await guarded(res, "latency", lambda: fig_latency(ctx, args, res))
    finally:
        ctx.watch = []
        stop_group([*stack.procs, *bare])
        res.record_procs([*stack.procs, *bare])


# CPU seconds of each party to a throughput run, read from /proc/<pid>/stat.
CpuMeter = dict[str, Callable[[], float]]
ENGINE_OWN_CPU = ("engine_worker", "relay")
SERVER_CPU = ("temporal", "postgres")


def throughput_cpu_meter(sv: Servers, stack: EngineStack, baseline: Proc, shape: Proc) -> CpuMeter:
    def own() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    return {
        "engine_worker": lambda: sum(process_cpu_s(p.pid) for p in stack.workers),
        "relay": lambda: process_cpu_s(stack.relay.pid),
        "baseline_worker": lambda: process_cpu_s(baseline.pid),
        "shape_worker": lambda: process_cpu_s(shape.pid),
        "temporal": lambda: process_cpu_s(sv.temporal.process.pid),
        "postgres": lambda: tree_cpu_s(sv.pg.pid),
        "bench_client": own,  # creates / starts and the polling, in this process
    }


def read_cpu(meter: CpuMeter) -> dict[str, float]:
    return {k: read() for k, read in meter.items()}


def cpu_delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a[k] for k in a}


# The bare sides of figure 1: the key under `figures.throughput`, the worker's CPU meter key,
# and whether it is the five-stage shape.
BARE_SIDES = (("baseline", "baseline_worker", False), ("shape", "shape_worker", True))
# Engine ÷ baseline jobs/s targets: the same shape (what the stages' own work costs) and the
# one-activity workflow (what the shape and the work cost together).
SHAPE_TARGET = 0.7
BASELINE_TARGET = 0.6
COMMITS_TARGET = 4.5


async def fig_throughput(
    ctx: Any, args: argparse.Namespace, queues: dict[str, str], res: Results, meter: CpuMeter
) -> None:
    from bench.figures import baseline_throughput, engine_throughput

    n, warm = args.jobs, args.warmup_jobs
    progress(f"throughput: warm-up ({warm} jobs each)")
    for side, _, shape in BARE_SIDES:
        await baseline_throughput(ctx, queues[side], warm, "warm", shape=shape)
    await engine_throughput(ctx, warm, "warm")
    # The idle engine still commits (the relay polls each RELAY_POLL_INTERVAL_S); its rate is
    # measured once, after the warm-up's counts have settled, and subtracted below.
    progress(f"throughput: {STATS_SETTLE_S:.0f}s for PostgreSQL statistics to settle")
    await asyncio.sleep(STATS_SETTLE_S)
    c_prev, t_prev, own_prev = await ctx.admin.xact_commit(), time.perf_counter(), ctx.edb.commits
    cpu_prev = read_cpu(meter)
    await asyncio.sleep(IDLE_PROBE_S)
    c_idle, t_idle = await ctx.admin.xact_commit(), time.perf_counter()
    idle_rate = (c_idle - c_prev) / (t_idle - t_prev)
    # Idle CPU (polls, timers) is subtracted the same way from the engine's settle time.
    idle_cpu = {k: v / (t_idle - t_prev) for k, v in cpu_delta(cpu_prev, read_cpu(meter)).items()}
    c_prev, t_prev = c_idle, t_idle
    eng_runs: list[dict[str, Any]] = []
    bare_runs: dict[str, list[dict[str, Any]]] = {side: [] for side, _, _ in BARE_SIDES}

    async def bare(r: int, side: str, shape: bool) -> None:
        cpu0 = read_cpu(meter)
        b = await baseline_throughput(ctx, queues[side], n, f"r{r}", shape=shape)
        b["cpu_s"] = cpu_delta(cpu0, read_cpu(meter))
        b["cpu_s_per_job"] = {k: v / n for k, v in b["cpu_s"].items()}
        bare_runs[side].append(b)

    async def engine(r: int) -> None:
        nonlocal c_prev, t_prev, own_prev
        cpu0, te0 = read_cpu(meter), time.perf_counter()
        e = await engine_throughput(ctx, n, f"r{r}")
        # Trailing work (completion events, workflow completions) lands in the settle time.
        await asyncio.sleep(STATS_SETTLE_S)
        c, t = await ctx.admin.xact_commit(), time.perf_counter()
        cpu_idle_s = (t - te0) - e["elapsed_s"]
        e["cpu_s"] = {
            k: v - idle_cpu[k] * cpu_idle_s for k, v in cpu_delta(cpu0, read_cpu(meter)).items()
        }
        e["cpu_s_per_job"] = {k: v / n for k, v in e["cpu_s"].items()}
        e["cpu_idle_s_subtracted"] = cpu_idle_s
        own = ctx.edb.commits - own_prev
        # Everything between two readings but the engine's run (its settle time, the bare
        # runs) is idle for the engine's database.
        idle_s = (t - t_prev) - e["elapsed_s"]
        engine_commits = (c - c_prev) - own - idle_rate * idle_s
        e["xact_commit"] = {
            "delta": c - c_prev,
            "bench_own": own,
            "idle_rate_per_s": idle_rate,
            "idle_s": idle_s,
            "engine": engine_commits,
            "per_job": engine_commits / n,
            "per_s": engine_commits / e["elapsed_s"],
        }
        c_prev, t_prev, own_prev = c, t, ctx.edb.commits
        eng_runs.append(e)

    runners: list[Callable[[int], Awaitable[None]]] = [
        *(
            (lambda r, side=side, shape=shape: bare(r, side, shape))
            for side, _, shape in BARE_SIDES
        ),
        engine,
    ]
    for r in range(args.reps):
        # The order rotates with each repetition, so drift on a shared machine hits all sides.
        for k in range(len(runners)):
            await runners[(r + k) % len(runners)](r)
        e, b, sh = eng_runs[-1], bare_runs["baseline"][-1], bare_runs["shape"][-1]
        progress(
            f"throughput rep {r + 1}/{args.reps}: engine {e['jobs_per_s']:.1f} jobs/s, "
            f"shape {sh['jobs_per_s']:.1f}, one-activity {b['jobs_per_s']:.1f}; "
            f"{e['xact_commit']['per_job']:.2f} commits/job; CPU ms/job engine "
            f"{1e3 * sum(e['cpu_s_per_job'][k] for k in ENGINE_OWN_CPU):.2f}, shape worker "
            f"{1e3 * sh['cpu_s_per_job']['shape_worker']:.2f}, one-activity worker "
            f"{1e3 * b['cpu_s_per_job']['baseline_worker']:.2f}"
        )
    f = res.fig("throughput")
    f["engine"] = {
        "reps": eng_runs,
        "median_jobs_per_s": median([e["jobs_per_s"] for e in eng_runs]),
    }
    for side, _, _ in BARE_SIDES:
        f[side] = {
            "reps": bare_runs[side],
            "median_jobs_per_s": median([b["jobs_per_s"] for b in bare_runs[side]]),
        }
    # Ratios of medians, and the median of each repetition's own ratio (the three runs of one
    # repetition are minutes apart, so the latter is less exposed to the machine's drift).
    for side, target in (("baseline", BASELINE_TARGET), ("shape", SHAPE_TARGET)):
        prefix = "" if side == "baseline" else "shape_"
        f[f"{prefix}ratio"] = ratio(f["engine"]["median_jobs_per_s"], f[side]["median_jobs_per_s"])
        f[f"{prefix}ratio_per_rep_median"] = median(
            [
                ratio(e["jobs_per_s"], b["jobs_per_s"])
                for e, b in zip(eng_runs, bare_runs[side], strict=True)
            ]
        )
        f[f"{prefix}target"] = f">= {target}"
        f[f"{prefix}met"] = f[f"{prefix}ratio"] >= target
    # CPU seconds per job: the processes each side runs (engine: worker + relay; a baseline:
    # its worker), and the same plus the Temporal server and PostgreSQL both use.
    sides: list[tuple[str, list[dict[str, Any]], tuple[str, ...]]] = [
        ("engine", eng_runs, ENGINE_OWN_CPU),
        *((side, bare_runs[side], (key,)) for side, key, _ in BARE_SIDES),
    ]
    for side, runs, own_keys in sides:
        f[side]["median_cpu_s_per_job"] = {
            k: median([x["cpu_s_per_job"][k] for x in runs]) for k in runs[0]["cpu_s_per_job"]
        }
        f[side]["median_own_cpu_s_per_job"] = median(
            [sum(x["cpu_s_per_job"][k] for k in own_keys) for x in runs]
        )
        f[side]["median_total_cpu_s_per_job"] = median(
            [sum(x["cpu_s_per_job"][k] for k in (*own_keys, *SERVER_CPU)) for x in runs]
        )
    for side in ("baseline", "shape"):
        prefix = "" if side == "baseline" else "shape_"
        f[f"{prefix}cpu_ratio"] = ratio(
            f["engine"]["median_own_cpu_s_per_job"], f[side]["median_own_cpu_s_per_job"]
        )
        f[f"{prefix}cpu_total_ratio"] = ratio(
            f["engine"]["median_total_cpu_s_per_job"], f[side]["median_total_cpu_s_per_job"]
        )
    # The target compares like with like: the engine's five stages against the bare five-stage
    # shape (the one-activity ratio is reported beside it, with no target).
    f["cpu_target"] = "<= 1.5"
    f["cpu_met"] = f["shape_cpu_ratio"] <= 1.5
    pg = res.fig("postgres")
    pg["commits_per_job"] = median([e["xact_commit"]["per_job"] for e in eng_runs])
    pg["engine_commits_per_s"] = median([e["xact_commit"]["per_s"] for e in eng_runs])
    pg["commits_target"] = f"<= {COMMITS_TARGET}"
    pg["commits_met"] = pg["commits_per_job"] <= COMMITS_TARGET


async def fig_relay(ctx: Any, args: argparse.Namespace, base_q: str, res: Results) -> None:
    from bench.figures import direct_start_latency, relay_latency

    count, gap = args.relay_samples, args.relay_gap_ms / 1000
    warm = max(5, count // 5)
    progress(f"relay: warm-up ({warm} samples each)")
    await direct_start_latency(ctx, base_q, warm, gap)
    await relay_latency(ctx, warm, gap, "warm")
    relay_runs: list[dict[str, Any]] = []
    direct_runs: list[dict[str, Any]] = []
    for r in range(args.reps):
        d = await direct_start_latency(ctx, base_q, count, gap)
        e = await relay_latency(ctx, count, gap, f"r{r}")
        progress(
            f"relay rep {r + 1}/{args.reps}: commit->started p50 {e['p50_ms']:.1f} "
            f"p99 {e['p99_ms']:.1f} ms; direct start p50 {d['p50_ms']:.1f} p99 {d['p99_ms']:.1f}"
        )
        relay_runs.append(e)
        direct_runs.append(d)
    f = res.fig("relay")
    f["relay"] = {
        "reps": relay_runs,
        "median_p50_ms": median([x["p50_ms"] for x in relay_runs]),
        "median_p99_ms": median([x["p99_ms"] for x in relay_runs]),
    }
    f["direct"] = {
        "reps": direct_runs,
        "median_p50_ms": median([x["p50_ms"] for x in direct_runs]),
        "median_p99_ms": median([x["p99_ms"] for x in direct_runs]),
    }
    rp50, rp99 = f["relay"]["median_p50_ms"], f["relay"]["median_p99_ms"]
    dp50, dp99 = f["direct"]["median_p50_ms"], f["direct"]["median_p99_ms"]
    f["p50_ratio"], f["p99_ratio"] = ratio(rp50, dp50), ratio(rp99, dp99)
    f["p50_delta_ms"] = rp50 - dp50
    f["p50_target"], f["p99_target"] = "<= direct p50 + 5 ms", "<= 2 x direct p99"
    f["p50_met"], f["p99_met"] = rp50 <= dp50 + 5.0, rp99 <= 2 * dp99


async def fig_latency(ctx: Any, args: argparse.Namespace, res: Results) -> None:
    from bench.figures import engine_latency

    warm_s = min(5.0, args.duration)
    progress(f"latency: warm-up ({args.rate:g} jobs/s for {warm_s:g}s)")
    await engine_latency(ctx, args.rate, warm_s, "warm")
    runs: list[dict[str, Any]] = []
    for r in range(args.reps):
        e = await engine_latency(ctx, args.rate, args.duration, f"r{r}")
        progress(
            f"latency rep {r + 1}/{args.reps}: p50 {e['p50_ms']:.1f} p95 {e['p95_ms']:.1f} "
            f"p99 {e['p99_ms']:.1f} ms"
        )
        runs.append(e)
    f = res.fig("latency")
    f["reps"] = runs
    for k in ("p50_ms", "p95_ms", "p99_ms"):
        f[f"median_{k}"] = median([x[k] for x in runs])


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


async def wait_http(url: str, timeout_s: float, procs: list[Proc]) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as c:
        while True:
            check_alive(procs)
            with contextlib.suppress(httpx.HTTPError):
                if (await c.get(url, timeout=1.0)).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not ready in {timeout_s:.0f}s")
            await asyncio.sleep(0.2)


async def phase_api(
    ctx: Any, args: argparse.Namespace, sv: Servers, knobs: EngineKnobs, res: Results
) -> None:
    from api.auth import issue_token
    from bench.wrk import wrk_path, wrk_version
    from jobs.service import CreateJobRequest
    from runtime.embedded import free_port

    port = free_port()
    env = engine_env(
        sv, knobs, suffix=f"-benchapi{uuid.uuid4().hex[:8]}", quotas=args.api_quotas == "default"
    )
    api = Proc(
        "api",
        [sys.executable, "-m", "bench.api_server", "--host", "127.0.0.1", "--port", str(port)],
        env,
        sv.log_dir,
    )
    base_url = f"http://127.0.0.1:{port}"
    get_users = [f"bench-api-get-{k}" for k in range(API_GET_JOBS)]
    get_auth = ["Bearer " + issue_token(BENCH_JWT_SECRET, u) for u in get_users]
    post_auth = [
        "Bearer " + issue_token(BENCH_JWT_SECRET, f"bench-api-post-{k}")
        for k in range(API_POST_USERS)
    ]
    ids: list[str] = []

    async def seed() -> None:
        await ctx.admin.wait_quiet()  # the requests of the last load still running
        await ctx.edb.truncate()
        ids.clear()
        for u in get_users:
            r = await ctx.svc.create(
                CreateJobRequest(
                    user_id=u, job_type="synthetic", target_type="bench", target_id="t1", input={}
                )
            )
            ids.append(str(r.job.id))

    wrk = wrk_path() if args.api_client != "python" else None
    if wrk is None and args.api_client == "wrk":
        raise RuntimeError("--api-client wrk: wrk is not on PATH (make bench installs it)")
    f = res.fig("api")
    if wrk is not None:
        f["client"] = "wrk"
        f["client_version"] = wrk_version(wrk)
        load = _wrk_load(wrk, args, base_url, sv.base, ids, get_auth, post_auth)
    else:
        # The Python client shares the bench process (and its CPU) with nothing else, but it
        # saturates a core long before the server does: only a fallback.
        chosen = args.api_client == "python"
        if not chosen:
            progress("api: wrk not found on PATH; falling back to the Python client")
        f["client"] = "python (--api-client python)" if chosen else "python (wrk not installed)"
        load = _python_load(args, base_url, ids, get_auth, post_auth)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in API_ROUTES}
    try:
        api.start()
        await wait_http(f"{base_url}/healthz", 60, [api])
        ctx.watch = [api]
        await seed()
        progress(f"api: warm-up {args.api_warmup_seconds:g}s per route ({f['client']})")
        for name in API_ROUTES:
            await load(name, args.api_warmup_seconds, api.pid)
        for r in range(args.reps):
            await seed()
            for name in API_ROUTES:
                out = await load(name, args.api_seconds, api.pid)
                check_alive([api])
                progress(
                    f"api rep {r + 1}/{args.reps}: {name:9s} {out['req_per_s']:7.0f} req/s "
                    f"p99 {out['p99_ms']:6.1f} ms (non-2xx {out['non_2xx']}, client cpu "
                    f"{out['client_cpu_pct']:.0f}%, server cpu {out['server_cpu_pct']:.0f}%)"
                )
                runs[name].append(out)
    finally:
        ctx.watch = []
        api.stop()
        res.record_procs([api])
        with contextlib.suppress(Exception):
            await ctx.edb.truncate()
    try:
        f["statements"] = await _create_path_statements(env)
    finally:
        await ctx.edb.truncate()  # its jobs' enqueue rows must not reach a later stack's relay
    for name, rr in runs.items():
        f[name] = {
            "reps": rr,
            "median_req_per_s": median([x["req_per_s"] for x in rr]),
            "median_p50_ms": median([x["p50_ms"] for x in rr]),
            "median_p99_ms": median([x["p99_ms"] for x in rr]),
            "median_client_cpu_pct": median([x["client_cpu_pct"] for x in rr]),
            "median_server_cpu_pct": median([x["server_cpu_pct"] for x in rr]),
            "non_2xx": sum(x["non_2xx"] for x in rr),
            "transport_errors": sum(sum(x["transport_errors"].values()) for x in rr),
        }
    f["idempotency_keys"] = "distinct" if args.api_idempotency_keys else "none"
    for route, bare, target in (("get", "get_bare", 0.8), ("post", "post_bare", 0.6)):
        f[f"{route}_ratio"] = ratio(f[route]["median_req_per_s"], f[bare]["median_req_per_s"])
        f[f"{route}_target"] = f">= {target}"
        f[f"{route}_met"] = f[f"{route}_ratio"] >= target
        if f[route]["non_2xx"] or f[bare]["non_2xx"]:
            res.data["errors"].append(
                {"where": "api", "error": f"non-2xx answers on {route}/{bare}; see the reps"}
            )
        if f[route]["transport_errors"] or f[bare]["transport_errors"]:
            res.data["errors"].append(
                {"where": "api", "error": f"transport errors on {route}/{bare}; see the reps"}
            )


async def _create_path_statements(env: dict[str, str]) -> dict[str, Any]:
    """The round trips of one real create and one real read (`bench/statements.py`, in a
    process of its own with the API server's environment), and of the bare routes."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.statements",
        "--requests",
        "20",
        "--jwt-secret",
        BENCH_JWT_SECRET,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"bench.statements failed: {err.decode()[-2000:]}")
    counted: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    progress(
        f"api: round trips per request: POST {counted['post']['round_trips']:g} "
        f"(bare {counted['post_bare']['round_trips']:g}), GET "
        f"{counted['get']['round_trips']:g} (bare {counted['get_bare']['round_trips']:g})"
    )
    return counted


API_ROUTES = ("get", "get_bare", "post", "post_bare")
_POST_BODY = json.dumps(
    {"jobType": "synthetic", "targetType": "bench", "targetId": "t1", "input": {}}
)
_LoadFn = Callable[[str, float, int], Awaitable[dict[str, Any]]]


def _wrk_load(
    wrk: str,
    args: argparse.Namespace,
    base_url: str,
    work_dir: Path,
    ids: list[str],
    get_auth: list[str],
    post_auth: list[str],
) -> _LoadFn:
    """One wrk run per call; the GET scripts are written per call, as the seeded ids change."""
    from bench.wrk import run_wrk, script_keyed_post, script_rotating

    json_ct = {"Content-Type": "application/json"}

    def script(name: str) -> str:
        if name == "get":
            return script_rotating(
                [
                    ("GET", f"/api/ai/jobs/{i}", {"Authorization": a}, None)
                    for i, a in zip(ids, get_auth, strict=True)
                ]
            )
        if name == "get_bare":
            return script_rotating([("GET", f"/bench/jobs/{i}", {}, None) for i in ids])
        if name == "post":
            if args.api_idempotency_keys:
                return script_keyed_post("/api/ai/jobs", post_auth, _POST_BODY)
            return script_rotating(
                [
                    ("POST", "/api/ai/jobs", {"Authorization": a, **json_ct}, _POST_BODY)
                    for a in post_auth
                ]
            )
        return script_rotating([("POST", "/bench/jobs", json_ct, _POST_BODY)])

    async def load(name: str, seconds: float, server_pid: int) -> dict[str, Any]:
        return await run_wrk(
            wrk,
            base_url + "/",
            script(name),
            threads=WRK_THREADS,
            connections=args.api_connections,
            seconds=seconds,
            server_pid=server_pid,
            work_dir=work_dir,
        )

    return load


def _python_load(
    args: argparse.Namespace,
    base_url: str,
    ids: list[str],
    get_auth: list[str],
    post_auth: list[str],
) -> _LoadFn:
    from bench.loadgen import Request, http_load

    body = _POST_BODY.encode()
    json_ct = {"content-type": "application/json"}
    m = len(get_auth)
    key_prefix = uuid.uuid4().hex[:12]

    def post(i: int) -> Request:
        headers = {"authorization": post_auth[i % API_POST_USERS], **json_ct}
        if args.api_idempotency_keys:
            headers["idempotency-key"] = f"{key_prefix}-{i}"
        return Request("POST", "/api/ai/jobs", headers, body)

    routes: dict[str, Callable[[int], Request]] = {
        "get": lambda i: Request(
            "GET", f"/api/ai/jobs/{ids[i % m]}", {"authorization": get_auth[i % m]}
        ),
        "get_bare": lambda i: Request("GET", f"/bench/jobs/{ids[i % m]}", {}),
        "post": post,
        "post_bare": lambda i: Request("POST", "/bench/jobs", json_ct, body),
    }

    async def load(name: str, seconds: float, server_pid: int) -> dict[str, Any]:
        out = await http_load(
            base_url,
            routes[name],
            seconds=seconds,
            connections=args.api_connections,
            server_pid=server_pid,
        )
        out["client"] = "python"
        out["non_2xx"] = sum(v for k, v in out["status_codes"].items() if int(k) >= 300)
        return out

    return load


async def phase_scale(args: argparse.Namespace, sv: Servers, res: Results) -> None:
    from bench import scale
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
        await scale.truncate(sv.database_url)
        progress("scale: queries on empty tables")
        f["empty"] = await scale.measure(engine, capture, sv.database_url, **kw)
        progress(f"scale: seeding {args.scale_jobs:,} jobs over {args.scale_users:,} users")
        f["seed"] = await scale.seed(sv.database_url, jobs=args.scale_jobs, users=args.scale_users)
        progress("scale: queries on the seeded tables")
        f["seeded"] = await scale.measure(engine, capture, sv.database_url, **kw)
    finally:
        await engine.dispose()
        with contextlib.suppress(Exception):
            await scale.truncate(sv.database_url)
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
