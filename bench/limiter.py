"""`python -m bench.limiter`: what the provider limiter (db/provider_limits.py, docs/limits.md)
costs when its limits never bind (docs/benchmarks.md, "Limiter overhead").

One embedded PostgreSQL and one in-memory Temporal dev server (`bench.infra.servers`); an engine
stack (relay + one worker, `bench.infra.EngineStack`) runs in one of two modes, one at a time
(two relays would share the outbox):

- `off`: no AI_MODEL_LIMITS: the synthetic provider's model costs the limiter no statement;
- `on`: AI_MODEL_LIMITS puts the model `synthetic` under rpm, tpm and concurrency limits far
  above anything the run reaches (`NEVER_BINDING`), so every call pays the limiter's locked
  read and update, its lease insert and count, and the statement at the call's end, and never
  waits.

Each repetition runs both modes, in alternating order (off, on / on, off ...) so drift on a
shared machine hits both; each mode gets a fresh stack, a warm-up, then:

- throughput: `--jobs` synthetic jobs created through `JobService.create` at `--concurrency`,
  SQL polled until all succeeded (`bench.figures.engine_throughput`, as figure 1 does), with
  the CPU seconds of the worker + relay and of PostgreSQL over the run;
- latency: `--probe-jobs` jobs one at a time (the next created when the previous succeeded),
  each job's `finished_at - created_at` from SQL: what one job waits with nothing queued.

The run checks that the limiter really ran in `on` (the key's `provider_limit` row was
refilled during the run) and not in `off` (the row untouched), and fails otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.infra import Admin, EngineDb, EngineKnobs, EngineStack, Servers, servers
from bench.procs import process_cpu_s, progress, tree_cpu_s
from bench.stats import median, percentile, ratio

# Far above what one worker reaches (about 20 jobs/s here): the buckets never empty and the
# leases never fill, so `on` measures the limiter's statements and never a wait.
NEVER_BINDING = {"synthetic": {"rpm": 2**31 - 1, "tpm": 2**31 - 1, "concurrency": 100_000}}
MODES = ("off", "on")
POLL_S = 0.02


async def limiter_touched(edb: EngineDb) -> datetime | None:
    """When the limiter last refilled the synthetic key's buckets (None: it never ran)."""
    rows = await edb.fetchall(
        "SELECT max(refilled_at) FROM provider_limit WHERE provider = 'synthetic'"
    )
    value = rows[0][0] if rows else None
    return value if isinstance(value, datetime) else None


async def probe_latency(ctx: Any, n: int, tag: str) -> list[float]:
    """`n` jobs one after another; each one's `finished_at - created_at` in seconds."""
    from jobs.service import CreateJobRequest

    await ctx.edb.truncate()
    for i in range(n):
        await ctx.svc.create(
            CreateJobRequest(
                user_id="bench-probe",
                job_type="synthetic",
                target_type="bench",
                target_id=f"{tag}-{i}",
                input={},
            )
        )
        deadline = time.monotonic() + 60
        while (await ctx.edb.status_counts())[0] < i + 1:
            if time.monotonic() > deadline:
                raise TimeoutError(f"probe job {i} did not succeed in 60 s")
            await asyncio.sleep(POLL_S)
    rows = await ctx.edb.fetchall(
        "SELECT extract(epoch FROM finished_at - created_at) FROM ai_job "
        "WHERE lifecycle_status = 'succeeded'"
    )
    return [float(r[0]) for r in rows]


async def run_mode(
    ctx: Any, sv: Servers, args: argparse.Namespace, mode: str, rep: int
) -> dict[str, Any]:
    from bench.figures import engine_throughput

    extra = {"AI_MODEL_LIMITS": json.dumps(NEVER_BINDING)} if mode == "on" else {}
    knobs = EngineKnobs(
        interactive_concurrency=args.interactive_concurrency,
        log_level=args.log_level,
        extra_env=extra,
    )
    stack = EngineStack(f"{mode}{rep}", sv, knobs, workers=1)
    try:
        await stack.start(ctx.client, ctx.admin)
        ctx.watch = stack.procs
        await engine_throughput(ctx, args.warmup_jobs, f"warm-{mode}{rep}")
        touched0 = await limiter_touched(ctx.edb)
        own0 = sum(process_cpu_s(p.pid) for p in stack.procs)
        pg0 = tree_cpu_s(sv.pg.pid)
        e = await engine_throughput(ctx, args.jobs, f"{mode}{rep}")
        own1 = sum(process_cpu_s(p.pid) for p in stack.procs)
        pg1 = tree_cpu_s(sv.pg.pid)
        lat = await probe_latency(ctx, args.probe_jobs, f"probe-{mode}{rep}")
        touched1 = await limiter_touched(ctx.edb)
    finally:
        ctx.watch = []
        stack.stop()
    ran = touched1 is not None and touched1 != touched0
    if ran != (mode == "on"):
        raise RuntimeError(
            f"the limiter {'did not run' if mode == 'on' else 'ran'} in mode {mode!r} "
            f"(provider_limit refilled_at {touched0} -> {touched1})"
        )
    out = {
        "mode": mode,
        "rep": rep,
        "jobs": args.jobs,
        "jobs_per_s": e["jobs_per_s"],
        "elapsed_s": e["elapsed_s"],
        "engine_cpu_ms_per_job": 1e3 * (own1 - own0) / args.jobs,
        "postgres_cpu_ms_per_job": 1e3 * (pg1 - pg0) / args.jobs,
        "latency_p50_ms": 1e3 * percentile(lat, 50),
        "latency_p95_ms": 1e3 * percentile(lat, 95),
        "probe_jobs": len(lat),
    }
    progress(
        f"rep {rep + 1} {mode}: {out['jobs_per_s']:.1f} jobs/s, engine CPU "
        f"{out['engine_cpu_ms_per_job']:.1f} ms/job, PostgreSQL "
        f"{out['postgres_cpu_ms_per_job']:.1f} ms/job, one job alone p50 "
        f"{out['latency_p50_ms']:.0f} ms"
    )
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from temporalio.client import Client

    from bench.figures import Ctx
    from db.session import make_engine, make_sessionmaker
    from jobs.service import CreatePolicy, JobService
    from jobs.types import default_catalog

    runs: list[dict[str, Any]] = []
    with servers(keep=args.keep) as sv:
        client = await Client.connect(sv.temporal_address, namespace="default")
        admin, edb = Admin(sv.admin_uri), EngineDb(sv.database_url)
        await admin.open()
        await edb.open()
        engine = make_engine(sv.database_url, pool_size=args.concurrency, max_overflow=8)
        svc = JobService(
            make_sessionmaker(engine),
            default_catalog(),
            CreatePolicy(max_active_jobs=0, max_jobs_per_day=0, synthetic_public=True),
        )
        ctx = Ctx(
            client=client, svc=svc, edb=edb, admin=admin, concurrency=args.concurrency, watch=[]
        )
        try:
            for rep in range(args.reps):
                order = MODES if rep % 2 == 0 else MODES[::-1]
                for mode in order:
                    runs.append(await run_mode(ctx, sv, args, mode, rep))
        finally:
            await engine.dispose()
            await edb.close()
            await admin.close()
    return summarize(runs)


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    keys = (
        "jobs_per_s",
        "engine_cpu_ms_per_job",
        "postgres_cpu_ms_per_job",
        "latency_p50_ms",
        "latency_p95_ms",
    )
    med = {m: {k: median([r[k] for r in runs if r["mode"] == m]) for k in keys} for m in MODES}
    per_rep = [
        ratio(on["jobs_per_s"], off["jobs_per_s"])
        for off, on in zip(
            [r for r in runs if r["mode"] == "off"],
            [r for r in runs if r["mode"] == "on"],
            strict=True,
        )
    ]
    off, on = med["off"], med["on"]
    return {
        "runs": list(runs),
        "median": med,
        "ratio_jobs_per_s": ratio(on["jobs_per_s"], off["jobs_per_s"]),
        "ratio_per_rep": per_rep,
        # What each job adds at saturation (1 / throughput) and alone (its own latency).
        "added_ms_per_job_at_saturation": 1e3 / on["jobs_per_s"] - 1e3 / off["jobs_per_s"],
        "added_latency_p50_ms": on["latency_p50_ms"] - off["latency_p50_ms"],
        "added_engine_cpu_ms_per_job": on["engine_cpu_ms_per_job"] - off["engine_cpu_ms_per_job"],
        "added_postgres_cpu_ms_per_job": (
            on["postgres_cpu_ms_per_job"] - off["postgres_cpu_ms_per_job"]
        ),
    }


def render(s: dict[str, Any], jobs: int, reps: int) -> str:
    off, on = s["median"]["off"], s["median"]["on"]
    rows = (
        ("jobs/s", "jobs_per_s", "{:.1f}"),
        ("engine CPU ms/job (worker + relay)", "engine_cpu_ms_per_job", "{:.1f}"),
        ("PostgreSQL CPU ms/job", "postgres_cpu_ms_per_job", "{:.1f}"),
        ("one job alone: latency p50 ms", "latency_p50_ms", "{:.0f}"),
        ("one job alone: latency p95 ms", "latency_p95_ms", "{:.0f}"),
    )
    lines = [
        f"Limiter overhead: {jobs} synthetic jobs per run, median of {reps} runs per mode",
        "",
        "| median | no limits | limits never binding | on - off |",
        "|---|---:|---:|---:|",
    ]
    for label, key, fmt in rows:
        lines.append(
            f"| {label} | {fmt.format(off[key])} | {fmt.format(on[key])} "
            f"| {on[key] - off[key]:+.1f} |"
        )
    per_rep = ", ".join(f"{r:.2f}" for r in s["ratio_per_rep"])
    lines += [
        "",
        f"jobs/s on / off: {s['ratio_jobs_per_s']:.2f} (per repetition: {per_rep}); "
        f"added per job at saturation (1/throughput): "
        f"{s['added_ms_per_job_at_saturation']:+.1f} ms; alone (p50 latency): "
        f"{s['added_latency_p50_ms']:+.1f} ms",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.limiter", description=__doc__)
    p.add_argument("--jobs", type=int, default=200, help="jobs per throughput run (200)")
    p.add_argument("--reps", type=int, default=4, help="runs per mode, alternating order (4)")
    p.add_argument("--warmup-jobs", type=int, default=40, help="untimed jobs per stack (40)")
    p.add_argument("--probe-jobs", type=int, default=30, help="one-at-a-time jobs (30)")
    p.add_argument("--concurrency", type=int, default=32, help="concurrent creates (32)")
    p.add_argument(
        "--interactive-concurrency", type=int, default=2, help="AI_INTERACTIVE_CONCURRENCY (2)"
    )
    p.add_argument("--log-level", default="INFO", help="LOG_LEVEL of the engine processes")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (data and logs)")
    p.add_argument("--output", help="also write every run and the summary as JSON here")
    args = p.parse_args(argv)
    summary = asyncio.run(run(args))
    print(render(summary, args.jobs, args.reps))
    if args.output:
        Path(args.output).write_text(json.dumps(summary, indent=2))
        print(f"runs and summary in {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
