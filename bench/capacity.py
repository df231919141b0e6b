"""`python -m bench.capacity`: what one job costs each part of the system, measured in one run
through the real stack, and the capacity model built from it (docs/benchmarks.md, "Capacity
model").

On the embedded PostgreSQL and the in-memory Temporal dev server of `bench.infra.servers`, it
starts one process per engine role with the `aijobs` CLI (`api`, `worker --queue
ai-interactive`, `worker --queue ai-background`, `worker --queue ai-system`, which runs the
relay shard and the reconciler), runs a warm-up, measures the idle stack, then creates `--jobs`
jobs over HTTP from `--users` users (synthetic jobs, every 1/`--background-share`-th one the
background type, all on the synthetic provider) and waits for every one to end. Around that run
it reads the CPU of every process, PostgreSQL's transactions and WAL position, and the Temporal
server's `action` counter; then it counts the events and Temporal Cloud actions of every job
workflow's history and of the system workflows' events in the run's window. The figures are per
job of the same run; the model (`bench/capacity_model.py`) turns them into cores, database
load, history shards, provider keys and Temporal Cloud money at 100 and 1,000 jobs/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.capacity_model import Assumptions
from bench.capacity_report import derive, per_job, rates, render
from bench.capacity_stack import (
    Stack,
    job_histories,
    job_requests,
    pg_counters,
    send_all,
    system_histories,
    temporal_actions,
    utc_now,
    wait_ended,
)
from bench.infra import STATS_SETTLE_S, Admin, EngineDb, EngineKnobs, Servers, servers
from bench.procs import progress
from bench.throughput import CpuMeter, read_cpu

RESULTS = Path(__file__).resolve().parent / "results" / "capacity.json"
JOB_PREFIXES = ("ai-interactive:", "ai-background:")


async def reading(admin: Admin, edb: EngineDb, sv: Servers, meter: CpuMeter) -> dict[str, Any]:
    return {
        "t": time.perf_counter(),
        "wall": utc_now(),
        "cpu": read_cpu(meter),
        "pg": await pg_counters(admin),
        "actions": await temporal_actions(sv),
        "own": edb.commits,
    }


async def run_jobs(
    args: argparse.Namespace, stack: Stack, edb: EngineDb, n: int, tag: str
) -> dict[str, Any]:
    """Create N jobs over HTTP and wait until every one has ended."""
    reqs = job_requests(n, args.users, args.background_share, tag)
    t0 = time.perf_counter()
    codes = await send_all(stack.base_url, reqs, args.concurrency)
    if set(codes) - {200, 202}:
        raise RuntimeError(f"POST /api/ai/jobs answered {dict(codes)}")
    ok, bad = await wait_ended(edb, stack, n, timeout_s=max(120.0, n * 1.0))
    active = time.perf_counter() - t0
    background = sum(1 for r in reqs if b"weak_point" in (r.content or b""))
    return {
        "n": n,
        "interactive": n - background,
        "background": background,
        "succeeded": ok,
        "failed_or_cancelled": bad,
        "active_s": active,
        "jobs_per_s": n / active,
    }


async def measure(args: argparse.Namespace, sv: Servers) -> dict[str, Any]:
    from temporalio.client import Client

    client = await Client.connect(sv.temporal_address, namespace="default")
    admin, edb = Admin(sv.admin_uri), EngineDb(sv.database_url)
    await admin.open()
    await edb.open()
    stack = Stack(sv)
    knobs = EngineKnobs(
        interactive_concurrency=args.interactive_concurrency,
        log_level="WARNING",
        extra_env=dict(args.extra_env),
    )
    try:
        stack.start(knobs)
        await stack.ready(client, admin)
        meter = stack.cpu_meter()
        progress(f"capacity: warm-up, {args.warmup_jobs} jobs")
        await run_jobs(args, stack, edb, args.warmup_jobs, "warm")
        await admin.wait_quiet()
        await edb.truncate()
        progress(f"capacity: {STATS_SETTLE_S:.0f}s for statistics to settle, then idle probe")
        await asyncio.sleep(STATS_SETTLE_S)
        i0 = await reading(admin, edb, sv, meter)
        await asyncio.sleep(args.idle_seconds)
        i1 = await reading(admin, edb, sv, meter)
        idle = rates(i0, i1)
        progress(f"capacity: {args.jobs} jobs from {args.users} users")
        r0 = await reading(admin, edb, sv, meter)
        run = await run_jobs(args, stack, edb, args.jobs, "run")
        progress(f"capacity: {run['jobs_per_s']:.1f} jobs/s; settling {STATS_SETTLE_S:.0f}s")
        await asyncio.sleep(STATS_SETTLE_S)
        r1 = await reading(admin, edb, sv, meter)
        run["per_job"] = per_job(r0, r1, idle, args.jobs, run["active_s"])
        return await _counts(args, client, edb, run, idle, (i0, i1))
    finally:
        stack.stop()
        await edb.close()
        await admin.close()


async def _counts(
    args: argparse.Namespace,
    client: Any,
    edb: EngineDb,
    run: dict[str, Any],
    idle: dict[str, Any],
    window: tuple[dict[str, Any], dict[str, Any]],
) -> dict[str, Any]:
    """Provider calls and tokens from the usage rows, the job workflows' histories, the system
    workflows' events during the idle probe (`window`), and the derived figures."""
    calls, tokens = (
        await edb.fetchall(
            "SELECT count(*), coalesce(sum(tokens_in + tokens_out), 0) FROM ai_usage_log"
        )
    )[0]
    run.update(provider_calls=int(calls), tokens=int(tokens), users=args.users)
    run["tokens_override"] = args.tokens_per_job
    run["background_type"] = "weak_point_analysis"
    run["system_window_s"] = window[1]["t"] - window[0]["t"]
    run["idle_actions_per_s"] = {k: v for k, v in idle["actions"].items() if v > 0}
    ids = [str(r[0]) for r in await edb.fetchall("SELECT workflow_id FROM ai_job ORDER BY id")]
    sample = ids if args.history_sample <= 0 else ids[: args.history_sample]
    progress(f"capacity: counting {len(sample)} job histories and the system workflows")
    jobs = await job_histories(client, sample)
    system, system_ids = await system_histories(
        client, JOB_PREFIXES, window[0]["wall"], window[1]["wall"]
    )
    a = assumptions(args)
    out = {
        "run": run,
        "idle": idle,
        "system_workflows": system_ids,
        "derived": derive(run, jobs, system, a),
    }
    return out


def assumptions(args: argparse.Namespace) -> Assumptions:
    return Assumptions(
        utilisation=args.utilisation,
        cores_per_machine=args.cores_per_machine,
        pg_max_tps=args.pg_max_tps,
        pg_max_wal_mb_s=args.pg_max_wal_mb_s,
        shard_events_per_s=args.shard_events_per_s,
        action_price_per_million=args.action_price,
        provider_rpm=args.provider_rpm,
        provider_tpm=args.provider_tpm,
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from engine.queues import QUEUES

    p = argparse.ArgumentParser(
        prog="python -m bench.capacity",
        description="What one job costs each role, measured through the real stack, and the "
        "capacity model for 100 and 1,000 jobs/s (docs/benchmarks.md, 'Capacity model').",
    )
    p.add_argument("--jobs", type=int, default=300, help="jobs of the measured run (300)")
    p.add_argument("--warmup-jobs", type=int, default=40, help="jobs of the warm-up (40)")
    p.add_argument("--users", type=int, default=8, help="users the jobs are spread over (8)")
    p.add_argument("--concurrency", type=int, default=16, help="concurrent POSTs (16)")
    p.add_argument(
        "--background-share", type=float, default=0.2, help="share of background jobs (0.2)"
    )
    p.add_argument(
        "--interactive-concurrency",
        type=int,
        default=QUEUES["ai-interactive"].concurrency,
        help="AI_INTERACTIVE_CONCURRENCY of the interactive worker (the queue's default)",
    )
    p.add_argument(
        "--idle-seconds",
        type=float,
        default=35.0,
        help="idle probe, long enough for one reconciler run (RECONCILE_INTERVAL_S 30) (35)",
    )
    p.add_argument("--history-sample", type=int, default=0, help="job histories counted (0: all)")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for every engine process")
    _add_assumption_args(p)
    p.add_argument("--tokens-per-job", type=float, help="provider tokens per job (measured)")
    p.add_argument("--output", default=str(RESULTS), help="JSON results path")
    p.add_argument("--keep", action="store_true", help="keep the data dirs and logs")
    args = p.parse_args(argv)
    args.extra_env = [tuple(kv.split("=", 1)) for kv in args.env]
    if args.jobs < 1 or args.users < 1 or not 0 <= args.background_share < 1:
        p.error("--jobs and --users must be positive, --background-share in [0, 1)")
    return args


def _add_assumption_args(p: argparse.ArgumentParser) -> None:
    """The model's inputs no run measures (docs/benchmarks.md states where each comes from)."""
    d = Assumptions()
    flags: tuple[tuple[str, type, float, str], ...] = (
        ("--utilisation", float, d.utilisation, "target CPU utilisation of a core"),
        ("--cores-per-machine", int, d.cores_per_machine, "cores of one machine"),
        ("--pg-max-tps", float, d.pg_max_tps, "write transactions/s one primary sustains"),
        ("--pg-max-wal-mb-s", float, d.pg_max_wal_mb_s, "WAL MB/s one primary sustains"),
        ("--shard-events-per-s", float, d.shard_events_per_s, "history events/s per shard"),
        ("--action-price", float, d.action_price_per_million, "USD per million actions"),
        ("--provider-rpm", float, d.provider_rpm, "requests/min per provider key"),
        ("--provider-tpm", float, d.provider_tpm, "tokens/min per provider key"),
    )
    for flag, kind, default, what in flags:
        p.add_argument(flag, type=kind, default=default, help=f"{what} ({default:g})")


def main(argv: Sequence[str] | None = None) -> None:
    from bench.procs import stop_all
    from bench.teardown import hard_exit

    args = parse_args(argv)
    load_start = os.getloadavg()[0]
    code = 0
    try:
        with servers(keep=args.keep) as sv:
            res = asyncio.run(measure(args, sv))
        res["load_start"], res["load_end"] = load_start, os.getloadavg()[0]
        res["cpus"] = os.cpu_count()
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(res, indent=2, default=str))
        print(render(res))
    except Exception as exc:  # the run's failure is reported; the children are stopped below
        progress(f"capacity: failed: {type(exc).__name__}: {exc}")
        code = 1
    finally:
        stop_all()
    hard_exit(code)


if __name__ == "__main__":
    main()
