"""`python -m bench [--quick] [...]`: the arguments, then start the embedded stack, run the
phases (`bench/phases.py`) and print the report (`bench/report.py`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.infra import STATS_SETTLE_S, servers
from bench.phases import run_all
from bench.procs import progress, stop_all
from bench.report import Results, write
from bench.table import render
from bench.teardown import hard_exit

FIGURES = (
    "throughput",
    "latency",
    "relay",
    "postgres",
    "scaling",
    "api",
    "scale",
    "fairness",
    "tracing",
    "idle",
)
DEFAULTS: dict[str, Any] = {
    "jobs": 500,
    "reps": 3,
    "warmup_jobs": 100,
    "concurrency": 32,
    "rate": 10.0,
    "duration": 30.0,
    "relay_samples": 100,
    "relay_gap_ms": 50.0,
    "relay_background": 200,
    "api_seconds": 8.0,
    "api_warmup_seconds": 2.0,
    "api_connections": 32,
    "pgbench_seconds": 10,
    "pgbench_clients": 8,
    "pgbench_threads": 2,
    "scale_jobs": 1_000_000,
    "scale_users": 5_000,
    "scale_runs": 50,
    "settle_seconds": STATS_SETTLE_S,
}
# A smoke run: every figure once, at sizes that prove each phase works, not that measure well
# (its idle backends' last commits may be read before PostgreSQL publishes them).
QUICK: dict[str, Any] = {
    "jobs": 60,
    "reps": 1,
    "warmup_jobs": 20,
    "duration": 3.0,
    "relay_samples": 10,
    "relay_background": 20,
    "api_seconds": 1.0,
    "api_warmup_seconds": 0.5,
    "pgbench_seconds": 2,
    "scale_jobs": 20_000,
    "scale_runs": 10,
    "settle_seconds": 2.0,
}
RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure the engine against baselines on this machine.",
    )
    _add_run_args(p)
    _add_api_args(p)
    _add_database_args(p)
    _add_engine_args(p)
    args = p.parse_args(argv)
    for key, value in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, QUICK.get(key, value) if args.quick else value)
    _check(p, args)
    return args


def _add_run_args(p: argparse.ArgumentParser) -> None:
    """The size of each figure's run: jobs, repetitions, load, API seconds and connections."""
    p.add_argument("--quick", action="store_true", help="smoke run: small N, one repetition")
    p.add_argument("--jobs", type=int, help="N for the throughput figures (500)")
    p.add_argument("--reps", type=int, help="repetitions per figure after the warm-up (3)")
    p.add_argument("--warmup-jobs", type=int, help="jobs in each throughput warm-up (100)")
    p.add_argument("--concurrency", type=int, help="concurrent creates / starts (32)")
    p.add_argument("--rate", type=float, help="offered load of the latency figure, jobs/s (10)")
    p.add_argument("--duration", type=float, help="seconds of offered load per repetition (30)")
    p.add_argument("--relay-samples", type=int, help="jobs per relay-latency repetition (100)")
    p.add_argument("--relay-gap-ms", type=float, help="pause between relay samples (50)")
    p.add_argument(
        "--relay-background",
        type=int,
        help="jobs running during the relay figure's loaded repetitions (200; 0: none)",
    )
    p.add_argument("--api-seconds", type=float, help="seconds per API route per repetition (8)")
    p.add_argument("--api-warmup-seconds", type=float, help="API warm-up per route (2)")
    p.add_argument("--api-connections", type=int, help="concurrent HTTP connections (32)")
    p.add_argument(
        "--settle-seconds",
        type=float,
        help=f"quiet before each commit-count reading ({STATS_SETTLE_S:g}: PostgreSQL publishes "
        "an idle backend's counts up to 10 s late; --quick 2)",
    )


def _add_api_args(p: argparse.ArgumentParser) -> None:
    """The API figure's load generator, idempotency keys and quotas."""
    p.add_argument(
        "--api-client",
        choices=("auto", "wrk", "python"),
        default="auto",
        help="API load generator: wrk when installed (auto), or the Python fallback",
    )
    p.add_argument(
        "--api-idempotency-keys",
        action="store_true",
        help="send a distinct Idempotency-Key with every POST /api/ai/jobs (default: none)",
    )
    p.add_argument(
        "--api-quotas",
        choices=("default", "off"),
        default="default",
        help="API create quotas: the product defaults with many distinct users, or off",
    )


def _add_database_args(p: argparse.ArgumentParser) -> None:
    """pgbench and the scale figure."""
    p.add_argument("--pgbench-seconds", type=int, help="pgbench -T per repetition (10)")
    p.add_argument("--pgbench-clients", type=int, help="pgbench -c (8)")
    p.add_argument("--pgbench-threads", type=int, help="pgbench -j (2)")
    p.add_argument("--scale-jobs", type=int, help="ai_job rows the scale figure seeds (1,000,000)")
    p.add_argument("--scale-users", type=int, help="users owning the seeded jobs (5,000)")
    p.add_argument("--scale-runs", type=int, help="timed runs per scale query (50)")


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    """The fairness figure, the engine processes' knobs, and what to run and keep."""
    from engine.queues import QUEUES

    p.add_argument(
        "--fairness-backlogs",
        help="comma-separated backlog sizes of user A in the fairness figure (40,200; --quick 20)",
    )
    p.add_argument(
        "--fairness-delay-ms",
        type=int,
        default=200,
        help="synthetic provider delay of every fairness-figure job, ms (200)",
    )
    p.add_argument(
        "--interactive-concurrency",
        type=int,
        default=QUEUES["ai-interactive"].concurrency,
        help="AI_INTERACTIVE_CONCURRENCY for engine and baseline workers (2)",
    )
    p.add_argument("--log-level", default="INFO", help="LOG_LEVEL of the engine processes")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the engine processes (e.g. DB_POOL_SIZE=20)",
    )
    p.add_argument("--only", help=f"comma-separated subset of: {', '.join(FIGURES)}")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (data and logs)")
    p.add_argument("--output", default=str(RESULTS), help="JSON results path")


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject what no figure can run with (exits through `p.error`), and derive `want`, the
    fairness backlogs and the extra environment."""
    for key in (
        "jobs",
        "reps",
        "warmup_jobs",
        "concurrency",
        "relay_samples",
        "api_connections",
        "scale_jobs",
        "scale_users",
        "scale_runs",
    ):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be at least 1")
    if args.settle_seconds < 0:
        p.error("--settle-seconds must be at least 0")
    want = set(FIGURES) if not args.only else {f.strip() for f in args.only.split(",")}
    unknown = want - set(FIGURES)
    if unknown:
        p.error(f"unknown figure(s): {', '.join(sorted(unknown))}")
    if want & {"postgres", "scaling"}:
        want.add("throughput")  # commits per job and the 1-worker figure come from it
    args.want = want
    if args.fairness_backlogs is None:
        args.fairness_backlogs = "20" if args.quick else "40,200"
    try:
        args.fairness_backlogs = [int(x) for x in args.fairness_backlogs.split(",") if x.strip()]
    except ValueError:
        p.error("--fairness-backlogs expects comma-separated integers")
    if not args.fairness_backlogs or min(args.fairness_backlogs) < 1:
        p.error("--fairness-backlogs must list sizes of at least 1")
    if args.fairness_delay_ms < 0:
        p.error("--fairness-delay-ms must be at least 0")
    args.extra_env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--env expects KEY=VALUE, got {item!r}")
        args.extra_env[key] = value


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwinds through every `finally`, which stop the children


def run(args: argparse.Namespace) -> int:
    res = Results(args)
    t0 = time.monotonic()
    try:
        with servers(keep=args.keep) as sv:
            try:
                asyncio.run(run_all(args, sv, res))
            except Exception as exc:
                progress(f"run aborted: {exc!r}")
                res.error("run", exc)
    except Exception as exc:  # the servers did not start
        progress(f"could not start the embedded stack: {exc!r}")
        res.error("servers", exc)
    res.data["duration_s"] = time.monotonic() - t0
    res.data["machine"]["loadavg_end"] = os.getloadavg()
    out = Path(args.output)
    write(res.data, out)
    print(render(res.data), flush=True)
    progress(f"wrote {out}")
    return 1 if res.data["errors"] else 0


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    code = 1
    try:
        code = run(args)
    except KeyboardInterrupt:
        progress("interrupted")
        code = 130
    finally:
        stop_all()
    hard_exit(code)
